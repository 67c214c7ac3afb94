"""What the bench/python scripts share: interleaved() times calls taking turns, and --json
writes their measured rows as Google Benchmark JSON, the shape
`--benchmark_out_format=json` writes with repetitions, so that tools/bench-summary tables them
as it does the C++ benchmarks (tools/bench-results.sh run BUILD_DIR python; bench/README.md).

    results = bench_json.Results("model_speed.py", runs=args.runs)   # context fields
    results.add("model_speed/model:flux/dtype:f32/config:0", seconds, unit="s",
                label="diffusers default", counters={"GFLOP/s": rate})
    results.write(args.json)                               # does nothing where args.json is None

Each row is a run of `len(seconds)` repetitions: one "iteration" entry per repetition (its time
in `real_time`) and the aggregates mean, median, stddev and cv, named NAME_mean and so on with
`run_name` NAME; bench-summary shows the median. Counters (rates such as "GFLOP/s" or "GB/s",
"frac_bw", or any other figure) go on the median entry, computed by the script from its
medians. Names follow Google Benchmark's "family/arg:value/..." so that bench-summary's
`--baseline ARG:VALUE` pairs a row with its baseline (VALUE digits: "lib:0" torch, "lib:1"
ditops). The context has Google Benchmark's fields (date, no host name, the script as
executable, the CPU count, the load average) and the script's: the ditops and torch versions,
the ISA ditops dispatches to, the command's arguments.
"""

import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

def interleaved(calls, runs):
    """Each call's wall seconds in each of `runs` turns, the calls taking turns (A, B, A, B,
    ...) after one warm-up call each, so that a shared machine's slow moments hit them alike."""
    for call in calls:
        call()
    seconds = [[] for _ in calls]
    for _ in range(runs):
        for call, spent in zip(calls, seconds):
            start = time.perf_counter()
            call()
            spent.append(time.perf_counter() - start)
    return seconds


# Google Benchmark's time units and their seconds.
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


class Results:
    """The rows one script measured, written as Google Benchmark JSON by write()."""

    def __init__(self, script, **context):
        self.script = script
        self.arguments = sys.argv[1:]
        self.context = context
        self.rows = []

    def add(self, name, seconds, unit="ms", label="", counters=None, extra=None):
        """A row: `seconds`, one wall time per repetition (a number is one repetition), shown
        in `unit`; `label` is the table's "what"; `counters` go on the median entry; `extra`,
        one dict per repetition, goes on that repetition's entry (figures no table shows)."""
        if unit not in UNITS:
            raise ValueError(f"unit {unit!r} is not one of {sorted(UNITS)}")
        seconds = [float(seconds)] if isinstance(seconds, (int, float)) else list(seconds)
        if not seconds:
            raise ValueError(f"{name}: no repetitions")
        self.rows.append((name, seconds, unit, label, dict(counters or {}), extra))

    def entries(self):
        entries = []
        for family, (name, seconds, unit, label, counters, extra) in enumerate(self.rows):
            times = [s / UNITS[unit] for s in seconds]
            common = dict(family_index=family, per_family_instance_index=0, run_name=name,
                          repetitions=len(times))
            for index, spent in enumerate(times):
                entry = dict(name=name, **common, run_type="iteration", repetition_index=index,
                             iterations=1, real_time=spent, cpu_time=spent, time_unit=unit)
                if extra:
                    entry.update(extra[index])
                if label:
                    entry["label"] = label
                entries.append(entry)
            median = statistics.median(times)
            mean = statistics.fmean(times)
            stddev = statistics.stdev(times) if len(times) > 1 else 0.0
            aggregates = (("mean", mean, "time"), ("median", median, "time"),
                          ("stddev", stddev, "time"),
                          ("cv", stddev / mean if mean else 0.0, "percentage"))
            for aggregate, value, aggregate_unit in aggregates:
                entry = dict(name=f"{name}_{aggregate}", **common, run_type="aggregate",
                             aggregate_name=aggregate, aggregate_unit=aggregate_unit,
                             iterations=len(times), real_time=value, cpu_time=value,
                             time_unit=unit)
                if aggregate == "median":
                    entry.update({key: float(value) for key, value in counters.items()
                                  if value is not None})
                if label:
                    entry["label"] = label
                entries.append(entry)
        return entries

    def write(self, path):
        """Writes the rows to `path` (nothing where `path` is None or empty)."""
        if not path:
            return
        context = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            host_name="", executable=f"bench/python/{self.script}", num_cpus=os.cpu_count(),
            load_avg=list(os.getloadavg()), arguments=self.arguments, **self.context)
        try:
            import ditops

            context.update(ditops_version=ditops.__version__, isa=ditops.cpu_info()["isa"])
        except ImportError:
            pass
        for module in ("torch", "diffusers"):
            if module in sys.modules:
                context[f"{module}_version"] = sys.modules[module].__version__
        text = json.dumps(dict(context=context, benchmarks=self.entries()), indent=1,
                          allow_nan=False)
        Path(path).write_text(text + "\n")
