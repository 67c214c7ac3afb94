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
