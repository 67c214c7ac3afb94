"""Small random configurations of diffusers' transformers (no weights are downloaded) and the
inputs of one forward call."""

import torch


def flux(dtype=torch.float32, height=16, width=16, text=8, heads=2, head_dim=64, layers=1,
         in_channels=16, text_dim=32, pooled_dim=32):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    rope_hw = (head_dim - head_dim // 8) // 2
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=in_channels, num_layers=layers, num_single_layers=layers,
        attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=text_dim,
        pooled_projection_dim=pooled_dim, guidance_embeds=True,
        axes_dims_rope=(head_dim // 8, rope_hw, rope_hw)).eval().to(dtype)
    ids = torch.zeros(height, width, 3)
    ids[..., 1] = torch.arange(height)[:, None]
    ids[..., 2] = torch.arange(width)[None, :]
    inputs = dict(hidden_states=torch.randn(1, height * width, in_channels, dtype=dtype),
                  encoder_hidden_states=torch.randn(1, text, text_dim, dtype=dtype),
                  pooled_projections=torch.randn(1, pooled_dim, dtype=dtype),
                  timestep=torch.tensor([0.5], dtype=dtype),
                  img_ids=ids.reshape(height * width, 3).to(dtype),
                  txt_ids=torch.zeros(text, 3, dtype=dtype),
                  guidance=torch.tensor([3.5], dtype=dtype), return_dict=False)
    return model, inputs


def wan(dtype=torch.float32, frames=3, height=16, width=16, heads=2, head_dim=64, layers=2,
        dim_in=16, ffn=256, text=16, text_dim=32):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=dim_in, out_channels=dim_in, text_dim=text_dim, freq_dim=256, ffn_dim=ffn,
        num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
        rope_max_seq_len=1024).eval().to(dtype)
    inputs = dict(hidden_states=torch.randn(1, dim_in, frames, height, width, dtype=dtype),
                  timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(1, text, text_dim, dtype=dtype),
                  return_dict=False)
    return model, inputs


def cogvideox(dtype=torch.float32, frames=2, height=16, width=16, text=16):
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=64, in_channels=16, out_channels=16,
        time_embed_dim=64, text_embed_dim=32, num_layers=2, sample_width=width,
        sample_height=height, sample_frames=9, patch_size=2, temporal_compression_ratio=4,
        max_text_seq_length=text, use_rotary_positional_embeddings=True).eval().to(dtype)
    grid = (height // 2, width // 2)
    crops = ((0, 0), grid)  # the pipeline's crop region when the grid is the base size
    cos, sin = get_3d_rotary_pos_embed(embed_dim=64, crops_coords=crops, grid_size=grid,
                                       temporal_size=frames, device="cpu")
    inputs = dict(hidden_states=torch.randn(1, frames, 16, height, width, dtype=dtype),
                  encoder_hidden_states=torch.randn(1, text, 32, dtype=dtype),
                  timestep=torch.tensor([500]), image_rotary_emb=(cos, sin), return_dict=False)
    return model, inputs


def hunyuan(dtype=torch.float32, frames=1, height=16, width=16, text=16, valid_text=10):
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(0)
    model = HunyuanVideoTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=64,
        num_layers=1, num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2,
        patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=32,
        pooled_projection_dim=32, rope_theta=256.0, rope_axes_dim=(16, 24, 24)).eval().to(dtype)
    mask = torch.zeros(1, text, dtype=torch.long)
    mask[:, :valid_text] = 1
    inputs = dict(hidden_states=torch.randn(1, 16, frames, height, width, dtype=dtype),
                  timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(1, text, 32, dtype=dtype),
                  encoder_attention_mask=mask, pooled_projections=torch.randn(1, 32, dtype=dtype),
                  guidance=torch.tensor([6000.0], dtype=dtype), return_dict=False)
    return model, inputs


MODELS = {"flux": flux, "wan": wan, "cogvideox": cogvideox, "hunyuan": hunyuan}


# ---- whole pipelines: text encoders, tokenizers, VAE and scheduler around a transformer --------


def tokenizer(max_length):
    """A tokenizer built in memory (nothing downloaded): one token per printable ASCII
    character, lower-cased, "</s>" appended (as T5's and CLIP's end of text), padded with
    "<pad>" up to max_length (model_max_length)."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for code in range(32, 127):
        vocab.setdefault(chr(code).lower(), len(vocab))
    model = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    model.normalizer = normalizers.Lowercase()
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                         special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=model, model_max_length=max_length,
                                   pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


VOCAB = 128  # the tokenizer's 98 tokens, rounded up


def _t5_encoder(dtype, width, umt5=False):
    """A one-layer T5 (or UMT5) encoder of width `width` (the transformer's text width)."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_class, model_class = ((UMT5Config, UMT5EncoderModel) if umt5
                                 else (T5Config, T5EncoderModel))
    config = config_class(vocab_size=VOCAB, d_model=width, d_kv=32, d_ff=64, num_layers=1,
                          num_heads=2, relative_attention_num_buckets=8, pad_token_id=0,
                          eos_token_id=1, decoder_start_token_id=0)
    return model_class(config).eval().to(dtype)


def flux_pipeline(dtype=torch.float32, heads=2, head_dim=64, text_dim=32, pooled_dim=32,
                  vae_channels=8):
    """diffusers' FluxPipeline (FLUX.1-dev's: guidance embedding, FlowMatchEuler with dynamic
    shifting) of random weights: flux()'s transformer with one double- and one single-stream
    block (64 input channels: 16 latent channels in 2 x 2 patches), one-layer CLIP (width
    pooled_dim, 77 tokens) and T5 (width text_dim) text encoders, and an AutoencoderKL with FLUX's 16 latent channels, scaling and shift
    factors and 8x downsampling (four levels of vae_channels channels, one layer each)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline
    from transformers import CLIPTextConfig, CLIPTextModel

    transformer, _ = flux(dtype, heads=heads, head_dim=head_dim, layers=1, in_channels=64,
                          text_dim=text_dim, pooled_dim=pooled_dim)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=VOCAB, hidden_size=pooled_dim, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=77, pad_token_id=0, bos_token_id=1,
        eos_token_id=1, projection_dim=pooled_dim)).eval().to(dtype)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(vae_channels,) * 4,
        layers_per_block=1, latent_channels=16, norm_num_groups=min(vae_channels, 8),
        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
        use_post_quant_conv=False).eval().to(dtype)
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
        shift=3.0, use_dynamic_shifting=True)
    return FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=tokenizer(77),
                        text_encoder_2=_t5_encoder(dtype, text_dim),
                        tokenizer_2=tokenizer(512), transformer=transformer)


def wan_pipeline(dtype=torch.float32, heads=2, head_dim=64, ffn=256, text_dim=32,
                 vae_channels=8):
    """diffusers' WanPipeline (Wan 2.1 text-to-video: UniPC with flow sigmas, shift 3.0) of
    random weights: wan()'s transformer with two blocks, a one-layer UMT5 text encoder (width
    text_dim) and an AutoencoderKLWan with 16 latent
    channels, 4x temporal and 8x spatial downsampling (vae_channels channels at every level,
    one residual block each)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline

    transformer, _ = wan(dtype, heads=heads, head_dim=head_dim, layers=2, dim_in=16, ffn=ffn,
                         text_dim=text_dim)
    vae = AutoencoderKLWan(base_dim=vae_channels, z_dim=16, dim_mult=[1, 1, 1, 1],
                           num_res_blocks=1, temperal_downsample=[False, True, True]).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer(512),
                       text_encoder=_t5_encoder(dtype, text_dim, umt5=True),
                       vae=vae.to(dtype), scheduler=scheduler, transformer=transformer)


PIPELINES = {"flux": flux_pipeline, "wan": wan_pipeline}
