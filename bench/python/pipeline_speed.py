"""Whole diffusers pipelines on the CPU, timed as a user runs them: `pipe(prompt,
num_inference_steps=20)` from the prompt to the decoded image (FLUX) or video (Wan), with
diffusers' defaults and after ditops.diffusers.optimize(pipe). Nothing is downloaded: the
pipelines are assembled from components of random weights (python/tests/models.py):

  flux: FluxPipeline (FLUX.1-dev's guidance embedding and FlowMatchEuler schedule), the
        transformer at FLUX's width (hidden 3072, 24 heads x 128, T5 width 4096, CLIP width
        768) with one double- and one single-stream block (the real model has 19 + 38), one-
        layer CLIP and T5 text encoders, a small AutoencoderKL with FLUX's 16 latent
        channels, scaling and shift; one transformer call per step.
  wan:  WanPipeline (Wan 2.1 text-to-video, UniPC with flow sigmas), the transformer at Wan
        1.3B's width (hidden 1536, 12 heads x 128, FFN 8960, UMT5 width 4096) with two blocks
        (the real model has 30), a one-layer UMT5 text encoder, a small AutoencoderKLWan;
        classifier-free guidance (guidance_scale 5): two transformer calls per step.
The text encoders and VAEs are small stand-ins: their share of the time here is not the real
models' (a real T5-XXL or Wan VAE costs far more); the transformer's per-block cost is real.

Sizes (--size): tiny (FLUX 256 x 256; Wan 5 frames at 128 x 128), small, the default, sized
for a 2-core machine (FLUX 512 x 512: 1024 image + 512 text tokens; Wan 9 frames at 320 x
192: 3 x 12 x 20 latent tokens + 512 text), full (FLUX 1024 x 1024: 4096 + 512 tokens; Wan
480p, 81 frames at 832 x 480: 21 x 30 x 52 tokens, hours on 2 cores); --height, --width,
--frames and --text override a preset (--text: max_sequence_length, 512 by default).
--narrow builds the pipelines at the test suite's small widths instead (python/tests/
test_pipeline.py's: seconds; tools/demo.sh --tiny runs it so): the figures then mean little.

Configurations, run in turn (A, B, C, A, B, C, ...) so that drift on a shared machine hits
them alike, each from the default model (ditops.diffusers.disable between them, then a fresh
optimize): diffusers default; optimize(pipe); optimize(pipe, quantize="w8a8_dynamic"); that
with step caching (cache=CacheConfig, see CACHE below); for Wan also optimize(pipe,
quantize="w8a8_dynamic", attention="rainfusion", sparsity=0.75). Every run starts from the same
seed. For each configuration the medians over --runs of: the total time of the call, the first
denoising step, the steady step (the median of the later steps; with step caching refresh
and reuse steps alternate), and the split between the text encoders, the transformer, the VAE
decode and the rest (the scheduler, latent preparation, post-processing), timed by forward
hooks on the pipeline's components; and the drift from the default run: PSNR of the decoded
output (dB, pixel values in [0, 1]) and rel-L2 of the final latents. Each default run after
the first is compared with the first bit for bit (disable restores the default model).

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/pipeline_speed.py \\
        [--model flux|wan|all] [--size tiny|small|full] [--steps 20] [--dtype f32|bf16]
        [--runs 3] [--threads 2] [--narrow] [--json FILE] [--png DIR] [--markdown FILE]

--json FILE writes the figures as Google Benchmark JSON (bench_json.py): rows
pipeline_speed/model:M/dtype:D/config:C, config 0 diffusers' default, each run's total time;
the median entry has the medians of first_step, steady_step, text_encoder, transformer, vae,
other and optimize (seconds), psnr (dB) and rel_l2 as counters, each run's entry its step
times (steps); the context says whether disable restored the default output (restored).
--markdown FILE writes the tables. --png DIR writes, per model, MODEL_outputs.png (each
configuration's decoded output side by side, Wan's middle frame) and MODEL_time.png (where the
time goes: stacked bars per configuration), drawn with PIL.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import bench_json
import ditops
import ditops.diffusers
from ditops import CacheConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))
import models  # noqa: E402  (the test suite's model builders)

PROMPT = "a red fox sitting in the snow at sunset, photograph, detailed fur"

# The pipelines at the real models' transformer width (two blocks), text width 4096.
BUILD = {
    "flux": dict(heads=24, head_dim=128, text_dim=4096, pooled_dim=768, vae_channels=16),
    "wan": dict(heads=12, head_dim=128, ffn=8960, text_dim=4096, vae_channels=16),
}

# (height, width, frames) per --size; frames only for Wan.
SIZES = {
    "flux": {"tiny": (256, 256, None), "small": (512, 512, None), "full": (1024, 1024, None)},
    "wan": {"tiny": (128, 128, 5), "small": (192, 320, 9), "full": (480, 832, 81)},
}


def cache_config(name, steps):
    """Step caching for `steps` denoising steps: dit_block_cache refreshing every 2nd step
    from step steps // 5 (FLUX.1's published 28-step schedule starts at 4, refreshes every
    2nd step and skips blocks 2-55 of 57: nearly all; with two blocks, both are skipped on
    reuse steps). Wan calls the transformer twice per step (CFG) and the agent counts calls,
    so steps_count, step_start and step_interval are doubled (docs/python.md): a refresh step's
    unconditional call reuses the conditional call's residual."""
    calls = 2 if name == "wan" else 1
    return CacheConfig("dit_block_cache", blocks_count=0, steps_count=steps * calls,
                       step_start=max(1, steps // 5) * calls, step_interval=2 * calls,
                       block_start=0, block_end=2)


def configurations(name, steps):
    """[(label, optimize's keywords or None for diffusers' default)]."""
    configs = [("diffusers default", None),
               ("optimize()", {}),
               ("optimize(quantize=\"w8a8_dynamic\")", dict(quantize="w8a8_dynamic")),
               ("w8a8 + step cache", dict(quantize="w8a8_dynamic",
                                          cache=cache_config(name, steps)))]
    if name == "wan":
        configs.append(("w8a8 + RainFusion 0.75", dict(quantize="w8a8_dynamic",
                                                      attention="rainfusion", sparsity=0.75)))
    return configs


class Timer:
    """Where one pipeline call's time goes: forward hooks on the text encoders and the
    transformer, a wrapper on the VAE's decode, and the ends of the denoising steps (the
    pipeline's callback_on_step_end, which also keeps the last step's latents)."""

    PARTS = ("text encoder", "transformer", "vae")

    def __init__(self, pipe):
        self.pipe = pipe
        for name in ("text_encoder", "text_encoder_2"):
            module = getattr(pipe, name, None)
            if module is not None:
                self._hook(module, "text encoder")
        self._hook(pipe.transformer, "transformer")
        decode = pipe.vae.decode

        def timed_decode(*args, **kwargs):
            start = time.perf_counter()
            try:
                return decode(*args, **kwargs)
            finally:
                self.seconds["vae"] += time.perf_counter() - start

        pipe.vae.decode = timed_decode
        self.reset()

    def _hook(self, module, part):
        def pre(module, args, kwargs):
            self._started[part] = time.perf_counter()
            if part == "transformer" and self.loop_start is None:
                self.loop_start = self._started[part]

        def post(module, args, kwargs, output):
            self.seconds[part] += time.perf_counter() - self._started[part]

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post, with_kwargs=True)

    def reset(self):
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self._started = {}
        self.loop_start = None
        self.step_ends = []
        self.latents = None

    def callback(self, pipe, step, timestep, kwargs):
        self.step_ends.append(time.perf_counter())
        if step == pipe.num_timesteps - 1:
            self.latents = kwargs["latents"].clone()
        return {}

    def steps(self):
        ends = [self.loop_start] + self.step_ends
        return [b - a for a, b in zip(ends, ends[1:])]


def generate(pipe, timer, name, args):
    """One pipeline call from the seed: (figures, decoded output as float32 numpy, latents)."""
    height, width, frames = args.shape
    options = dict(height=height, width=width, num_inference_steps=args.steps,
                   max_sequence_length=args.text, generator=torch.Generator().manual_seed(0),
                   output_type="np", callback_on_step_end=timer.callback)
    if name == "wan":
        options["num_frames"] = frames
    timer.reset()
    start = time.perf_counter()
    out = pipe(PROMPT, **options)
    total = time.perf_counter() - start
    steps = timer.steps()
    figures = dict(total=total, first_step=steps[0],
                   steady_step=statistics.median(steps[1:]) if len(steps) > 1 else steps[0],
                   **{part.replace(" ", "_"): timer.seconds[part] for part in Timer.PARTS})
    figures["other"] = total - sum(timer.seconds.values())
    figures["steps"] = steps
    image = out.frames[0] if name == "wan" else out.images[0]
    return figures, np.asarray(image, dtype=np.float32), timer.latents


def psnr(a, b):
    """PSNR in dB of values in [0, 1]; None where a and b are equal."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return None if mse == 0 else float(10 * np.log10(1.0 / mse))


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def bench(name, args):
    """Runs every configuration of one model --runs times in turn; returns the results."""
    dtype = DTYPES[args.dtype]
    pipe = models.PIPELINES[name](dtype, **({} if args.narrow else BUILD[name]))
    pipe.set_progress_bar_config(disable=True)
    timer = Timer(pipe)
    configs = configurations(name, args.steps)
    runs = {label: [] for label, _ in configs}
    outputs, latents, reports = {}, {}, {}
    restored = True
    for _ in range(args.runs):
        for label, options in configs:
            ditops.diffusers.disable(pipe.transformer)
            optimize_seconds = None
            if options is not None:
                start = time.perf_counter()
                reports[label] = ditops.diffusers.optimize(pipe, **options)
                optimize_seconds = time.perf_counter() - start
            figures, image, last = generate(pipe, timer, name, args)
            figures["optimize"] = optimize_seconds
            runs[label].append(figures)
            if options is None and label in outputs:  # disable restored the default model?
                restored &= (np.array_equal(image, outputs[label])
                             and torch.equal(last, latents[label]))
            outputs[label], latents[label] = image, last
            print(f"  {label}: {figures['total']:.2f} s", file=sys.stderr, flush=True)
    ditops.diffusers.disable(pipe.transformer)
    baseline = statistics.median(run["total"] for run in runs[configs[0][0]])
    results = []
    for label, options in configs:
        medians = {key: statistics.median(run[key] for run in runs[label])
                   for key in runs[label][0] if key not in ("optimize", "steps")}
        optimize_times = [run["optimize"] for run in runs[label] if run["optimize"] is not None]
        results.append(dict(
            configuration=label, **medians,
            optimize=statistics.median(optimize_times) if optimize_times else None,
            speedup=baseline / medians["total"],
            psnr=None if options is None else psnr(outputs[label], outputs[configs[0][0]]),
            rel_l2=None if options is None else rel_l2(latents[label], latents[configs[0][0]]),
            totals=[run["total"] for run in runs[label]],
            step_times=[run["steps"] for run in runs[label]],
            report=str(reports[label]) if label in reports else None))
    return dict(model=name, shape=list(args.shape), steps=args.steps, text=args.text,
                restored=restored if args.runs > 1 else None, results=results), outputs


def table(result):
    height, width, frames = result["shape"]
    size = f"{width} x {height}" + (f", {frames} frames" if frames else "")
    lines = [f"\n{result['model'].upper()} pipeline, {size}, {result['steps']} steps, "
             f"{result['text']} text tokens",
             "| configuration | total s | speed-up | first step s | steady step s | "
             "text enc. s | transformer s | VAE s | other s | PSNR dB | latent rel-L2 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["results"]:
        if row["rel_l2"] is None:
            drift = "- | -"
        else:
            drift = ("equal" if row["psnr"] is None else f"{row['psnr']:.1f}") + (
                f" | {row['rel_l2']:.1e}")
        lines.append(f"| {row['configuration']} | {row['total']:.2f} | {row['speedup']:.2f}x | "
                     f"{row['first_step']:.2f} | {row['steady_step']:.2f} | "
                     f"{row['text_encoder']:.2f} | {row['transformer']:.2f} | {row['vae']:.2f} | "
                     f"{row['other']:.2f} | {drift} |")
    if result["restored"] is not None:
        lines.append(f"\ndisable() restored the default output bit for bit: "
                     f"{'yes' if result['restored'] else 'NO'}")
    return "\n".join(lines)


def json_results(results, args):
    """The figures as bench_json rows, one per model and configuration."""
    rows = bench_json.Results(
        "pipeline_speed.py", threads=args.threads, runs=args.runs, steps=args.steps,
        restored={result["model"]: result["restored"] for result in results},
        shapes={result["model"]: result["shape"] for result in results}, text=args.text)
    for result in results:
        height, width, frames = result["shape"]
        size = f"{width} x {height}" + (f", {frames} frames" if frames else "")
        for index, row in enumerate(result["results"]):
            label = (f"{row['configuration']}; {size}, {result['steps']} steps; first / steady "
                     f"step {row['first_step']:.2f} / {row['steady_step']:.2f} s")
            if row["rel_l2"] is not None:
                label += ("; output equal" if row["psnr"] is None else
                          f"; PSNR {row['psnr']:.1f} dB") + f", latent rel-L2 {row['rel_l2']:.1e}"
            counters = {key: row[key] for key in ("first_step", "steady_step", "text_encoder",
                                                  "transformer", "vae", "other", "optimize",
                                                  "psnr", "rel_l2")}
            rows.add(f"pipeline_speed/model:{result['model']}/dtype:{args.dtype}/config:{index}",
                     row["totals"], unit="s", label=label, counters=counters,
                     extra=[dict(steps=steps) for steps in row["step_times"]])
    return rows


# ---- PNG output (PIL only) -------------------------------------------------------------------

# The parts of the time, their colors and legends.
COLORS = {"text encoder": (86, 180, 233), "transformer": (230, 159, 0), "vae": (0, 158, 115),
          "other": (160, 160, 160)}
LEGEND = {"text encoder": "text encoders", "transformer": "transformer", "vae": "VAE decode",
          "other": "other"}


def outputs_png(result, outputs, path):
    """Each configuration's decoded output (Wan: the middle frame) side by side, labeled with
    the configuration, its time and its PSNR to the default; small outputs are enlarged
    (nearest pixel) to 256 wide so that the labels fit."""
    from PIL import Image, ImageDraw

    images = []
    for row in result["results"]:
        pixels = outputs[row["configuration"]]
        if pixels.ndim == 4:  # Wan: frames, height, width, channels
            pixels = pixels[len(pixels) // 2]
        image = Image.fromarray((pixels.clip(0, 1) * 255).round().astype(np.uint8))
        factor = -(-256 // image.width)
        if factor > 1:
            image = image.resize((image.width * factor, image.height * factor), Image.NEAREST)
        images.append((row, image))
    width, height = images[0][1].size
    label_height = 30
    sheet = Image.new("RGB", (width * len(images), height + label_height), "white")
    draw = ImageDraw.Draw(sheet)
    for index, (row, image) in enumerate(images):
        sheet.paste(image, (index * width, label_height))
        drift = "" if row["psnr"] is None else f", {row['psnr']:.1f} dB"
        draw.text((index * width + 4, 2), row["configuration"], fill="black")
        draw.text((index * width + 4, 15), f"{row['total']:.1f} s{drift}", fill="black")
    sheet.save(path)


def time_png(result, path):
    """Horizontal stacked bars, one per configuration: text encoder / transformer / VAE /
    other, to a common scale in seconds."""
    from PIL import Image, ImageDraw

    rows = result["results"]
    label_width, bar_width, bar_height, gap, top = 260, 560, 24, 10, 40
    height = top + len(rows) * (bar_height + gap) + 40
    image = Image.new("RGB", (label_width + bar_width + 90, height), "white")
    draw = ImageDraw.Draw(image)
    longest = max(row["total"] for row in rows)
    draw.text((8, 8), f"{result['model'].upper()}: median seconds per pipeline call "
              f"({result['steps']} steps)", fill="black")
    for index, row in enumerate(rows):
        y = top + index * (bar_height + gap)
        draw.text((8, y + 6), row["configuration"], fill="black")
        x = label_width
        for part in COLORS:
            seconds = max(0.0, row[part.replace(" ", "_")])
            span = seconds / longest * bar_width
            draw.rectangle([x, y, x + span, y + bar_height], fill=COLORS[part])
            x += span
        draw.text((x + 6, y + 6), f"{row['total']:.1f} s", fill="black")
    y = height - 26
    x = label_width
    for part, color in COLORS.items():
        draw.rectangle([x, y, x + 14, y + 14], fill=color)
        draw.text((x + 20, y + 2), LEGEND[part], fill="black")
        x += 130
    image.save(path)


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["flux", "wan", "all"], default="all")
    parser.add_argument("--size", choices=["tiny", "small", "full"], default="small")
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--frames", type=int, help="Wan's frame count (4k + 1)")
    parser.add_argument("--text", type=int, default=512, help="max_sequence_length")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32",
                        help="every component's weights and activations")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--narrow", action="store_true",
                        help="the test suite's small widths instead of the real models'")
    parser.add_argument("--json", help="write the figures to this file (bench_json.py)")
    parser.add_argument("--png", help="write the outputs and time charts into this directory")
    parser.add_argument("--markdown", help="write the tables to this file too")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    info = ditops.cpu_info()
    import diffusers

    diffusers.utils.logging.set_verbosity_error()  # the pipelines' per-call notes
    header = (f"torch {torch.__version__}, diffusers {diffusers.__version__}, threads "
              f"{args.threads}, ditops isa {info['isa']}, {args.dtype}, {args.runs} runs "
              "(medians)")
    print(header)
    results, tables = [], [header]
    with torch.inference_mode():
        for name in (["flux", "wan"] if args.model == "all" else [args.model]):
            height, width, frames = SIZES[name][args.size]
            args.shape = (args.height or height, args.width or width,
                          (args.frames or frames) if name == "wan" else None)
            result, outputs = bench(name, args)
            result["dtype"] = args.dtype
            results.append(result)
            tables.append(table(result))
            print(tables[-1], flush=True)
            if args.png:
                directory = Path(args.png)
                directory.mkdir(parents=True, exist_ok=True)
                outputs_png(result, outputs, directory / f"{name}_outputs.png")
                time_png(result, directory / f"{name}_time.png")
    if args.json:
        json_results(results, args).write(args.json)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(tables) + "\n")


if __name__ == "__main__":
    main()
