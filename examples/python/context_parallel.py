"""A diffusers transformer sequence-parallel over torch.distributed processes, its attention
on ditops.distributed. Launch one process per rank with torchrun:

    torchrun --nproc-per-node 2 examples/python/context_parallel.py --model wan

and across machines the same script with torchrun's usual rendezvous (on every machine:
--nnodes M --node-rank I --master-addr HOST --master-port PORT, or --rdzv-endpoint). The model is
built from a small random configuration (nothing is downloaded): put your pipeline's
transformer in its place. With --check, rank 0 also runs the model on its own and compares.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import ditops
import ditops.diffusers


def wan(frames, height, width):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64, in_channels=16,
        out_channels=16, text_dim=64, freq_dim=256, ffn_dim=512, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024).eval()
    tokens = frames * (height // 2) * (width // 2)
    # A timestep per token (as Wan 2.2 takes them): diffusers' plan splits it with the tokens.
    inputs = dict(hidden_states=torch.randn(1, 16, frames, height, width),
                  timestep=torch.full((1, tokens), 500), encoder_hidden_states=torch.randn(1, 32, 64),
                  return_dict=False)
    return model, inputs


def flux(height, width):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=64,
        num_attention_heads=4, joint_attention_dim=64, pooled_projection_dim=64,
        guidance_embeds=True, axes_dims_rope=(8, 28, 28)).eval()
    ids = torch.zeros(height, width, 3)
    ids[..., 1] = torch.arange(height)[:, None]
    ids[..., 2] = torch.arange(width)[None, :]
    inputs = dict(hidden_states=torch.randn(1, height * width, 16),
                  encoder_hidden_states=torch.randn(1, 32, 64), pooled_projections=torch.randn(1, 64),
                  timestep=torch.tensor([0.5]), img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(32, 3),
                  guidance=torch.tensor([3.5]), return_dict=False)
    return model, inputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["wan", "flux"], default="wan")
    parser.add_argument("--ulysses", type=int, default=1,
                        help="Ulysses degree (the ring degree is the world size divided by it)")
    parser.add_argument("--check", action="store_true", help="compare with one process")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    ditops.set_num_threads(threads)
    model, inputs = wan(5, 32, 32) if args.model == "wan" else flux(32, 32)
    with torch.no_grad():
        ditops.diffusers.enable(model)
        single = model(**inputs)[0] if args.check and rank == 0 else None
        ditops.diffusers.enable_parallelism(model, ring_degree=world // args.ulysses,
                                            ulysses_degree=args.ulysses)
        start = time.perf_counter()
        parallel = model(**inputs)[0]
        seconds = time.perf_counter() - start
    if rank == 0:
        print(f"{args.model}: {world} processes (ring {world // args.ulysses} x Ulysses "
              f"{args.ulysses}), output {list(parallel.shape)} in {seconds:.2f} s")
        if single is not None:
            error = (parallel - single).abs().max().item() / single.abs().max().item()
            print(f"largest difference from one process: {error:.2e} of the largest output")
            if error > 1e-4:
                raise SystemExit("sequence-parallel output differs from one process")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
