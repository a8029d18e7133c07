"""How well a sweep packs onto the GPUs of one node, and how long Snakemake takes to plan a big DAG.

1. Schedule. A realistic sweep, 30 checkpoints x 7 tasks, is run for real by Snakemake through
   profiles/local with a fake pool of 8 GPUs (`--resources gpu=8`; each infer job leases a device
   with ckpteval.engine.gpus, exactly as the workflow's infer job does). The DAG has the workflow's shape:
   one infer job per checkpoint (engine load + every task's generation, on one GPU), one CPU
   evaluate job per (checkpoint, task), one aggregate, and with tail assist (`--assist`) one
   assist job per GPU beyond the first. Durations are drawn from a seeded distribution in
   simulated minutes and slept scaled down (`--scale` seconds per minute): per-task generation
   times with a per-checkpoint log-normal spread, log-normal scoring times.
   Each infer job's Snakemake `priority` is ckpteval's own estimate of its GPU seconds
   (`ckpteval.engine.schedule.expected_seconds`, what the workflow's infer rules use), fed with what the
   workflow would know in the scenario (`--scenario`):

   - first:     one run evaluated for the first time: every checkpoint has the same model size
                and tasks, so every estimate is equal and Snakemake's own order decides;
   - sizes:     two runs in one sweep, a 1.7B and a 7B model (a third of the checkpoints), priced
                by weight bytes x tokens before anything is measured;
   - remeasure: the run evaluated again (a new engine setting or vLLM version): the
                `.meta.json` of the earlier sweep measured every job, within a 5% spread.

   Tail assist runs the workflow's mechanism through the real ckpteval.engine.assist code; only the engine
   is fake. An infer job cuts each task's generation into 4 chunks (~256 requests, about a
   simulated minute each; ~28 per job, chunk cost proportional to its seconds), publishes them on a
   board under cache/.boards (Board.publish), sleeps its engine load, then generates them in order
   with share.work_through (sleeping each chunk, then Board.mark_done and Board.report), waiting
   at the end for the chunks assistants took. The assist rule mirrors the workflow's: input every
   consolidated model, `gpu=1`, priority -1, so Snakemake starts one only when every infer job
   has a GPU. It leases a device and runs share.assist: it joins the board with the most work
   left, sleeps that checkpoint's load time, and sleeps chunks taken from the back, until no board
   is worth another load. With assist off, infer jobs publish nothing (as with `assist: false`).

   Every job records its start and end; the script prints, for assist off and on (`--assist`),

   - makespan: first job start to last job end, assist jobs included (the ratio pays their
     extra engine loads);
   - lower bound: the larger of (a) total GPU work / GPUs + the shortest possible tail after the
     last GPU job (its slowest evaluation, then aggregate), and (b) the longest chain
     infer -> evaluate -> aggregate;
   - their ratio (target <= 1.10), GPU-slot utilisation (device-held time of infer and assist
     jobs / (GPUs x span of the infer phase)), and whether any two GPU jobs held one device at once;
   - with assist on: what the assist jobs did (GPU-minutes loading, generating, idle), when each
     ran and whose chunks it generated, and for each helped (or last-ending) infer job how many
     of its chunks assistants generated and how long it waited for them at the end;
   - with both settings, the two ratios side by side (compare within one run: timings on a
     shared machine drift between runs);
   - for reference, the makespan of overhead-free list schedules of the same whole jobs, without
     assist: longest job first (what a scheduler that knew the durations would do), in the order
     Snakemake started them, and in step order (what equal priorities give). Their distance to
     the bound is granularity (30 jobs on 8 GPUs leave slots idle in the last wave), not
     Snakemake: that is the gap tail assist closes, by splitting the last jobs. The rest of the
     gap to the measured makespan is per-job overhead (process start-up on this 2-core machine),
     which shrinks as jobs get longer.

2. Dry run. Seconds for `snakemake -n` (greedy scheduler) on a 10,000-job DAG: the synthetic
   sweep's, and the repository's own workflow on 1,111 empty checkpoint directories x 7 tasks.

    python bench/schedule.py [--scenario first|sizes|remeasure|all] [--assist on|off|both]
                             [--checkpoints 30] [--tasks 7] [--gpus 8] [--cores 32]
                             [--scale 1.0] [--seed 0]
                             [--dryrun-jobs 10000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCAL_PROFILE = REPO / "profiles" / "local"

# Simulated minutes. Generation per task on one GPU (a 7B model, a few hundred samples each);
# the per-checkpoint spread models early checkpoints that ramble to max_new_tokens.
TASK_MINUTES = [4.0, 6.0, 3.0, 8.0, 5.0, 2.0, 7.0, 4.0, 6.0, 3.0]
LOAD_MINUTES = 1.5
GEN_SIGMA = 0.25
EVAL_MEDIAN_MINUTES = 1.0
EVAL_SIGMA = 0.6
AGGREGATE_MINUTES = 0.5
#: An infer job's generation of one task, cut into this many chunks of ~256 requests (a minute
#: each, give or take): ~28 chunks per job, as MissingRequests cuts them.
CHUNKS_PER_TASK = 4
#: An assist job that finds nothing worth helping waits this long for boards (simulated minutes:
#: a job publishes its board a moment after it starts; the workflow waits 30 s).
ASSIST_GRACE_MINUTES = 5.0
#: How often an assist job looks at the boards (simulated minutes; the workflow: every 2 s).
ASSIST_POLL_MINUTES = 0.2

SNAKEFILE = '''\
import json, sys

from ckpteval.engine.schedule import Measurement, expected_seconds

PLAN = json.load(open("plan.json"))
CKPTS = list(PLAN["infer"])
TASKS = PLAN["tasks"]
JOB = sys.executable + " " + PLAN["job_script"]


def infer_priority(wildcards):
    """What the workflow's infer rules do: expected GPU seconds from static figures and history."""
    known = PLAN["known"][wildcards.ckpt]
    history = PLAN["history"][known["run"]]
    return expected_seconds(
        {(t, "v"): units for t, units in known["static"].items()},
        {(t, "v"): [Measurement(step, sec) for step, sec in history.get(t, [])] for t in TASKS},
        known["step"])

localrules: all

ASSISTS = expand("assist/{i}.json", i=range(PLAN["gpus"] - 1)) if PLAN.get("assist") else []

rule all:
    input: "summary.json", ASSISTS

rule consolidate:
    output: "models/{ckpt}.json"
    shell: JOB + " consolidate {output} 0"

rule infer:
    input: "models/{ckpt}.json"
    output: expand("generations/{{ckpt}}/{task}.json", task=TASKS)
    params: seconds=lambda w: PLAN["infer"][w.ckpt]
    resources: gpu=1
    priority: infer_priority
    shell: JOB + " infer '{output}' {params.seconds}"

rule evaluate:
    input: "generations/{ckpt}/{task}.json"
    output: "scores/{ckpt}/{task}.json"
    params: seconds=lambda w: PLAN["evaluate"][w.ckpt][w.task]
    shell: JOB + " evaluate {output} {params.seconds}"

rule aggregate:
    input: expand("scores/{ckpt}/{task}.json", ckpt=CKPTS, task=TASKS)
    output: "summary.json"
    params: seconds=PLAN["aggregate"]
    shell: JOB + " aggregate {output} {params.seconds}"

# The workflow's tail assist: one job per GPU beyond the first, started only once every infer job
# is ready (and, higher in priority, has a GPU first); it helps the infer jobs still running.
rule assist:
    input: expand("models/{ckpt}.json", ckpt=CKPTS)
    output: "assist/{i}.json"
    wildcard_constraints: i=r"[0-9]+"
    resources: gpu=1
    priority: -1
    shell: JOB + " assist {output} 0"
'''

# One job. infer and assist lease a fake GPU (as the workflow's do); infer loads (sleeps), then
# generates its chunks (sleeps) through ckpteval.engine.assist.work_through, on a published board when the
# sweep has assist jobs; assist runs ckpteval.engine.assist.assist with an engine that sleeps. Each job
# writes a record per output.
JOB_SCRIPT = """\
import json, logging, sys, time
from pathlib import Path

kind, outputs, seconds = sys.argv[1], sys.argv[2].split(), float(sys.argv[3])
plan = json.load(open("plan.json"))
name = Path(outputs[0]).parts[1] if kind == "infer" else Path(outputs[0]).stem
Path("logs").mkdir(exist_ok=True)
logging.basicConfig(filename=f"logs/{kind}-{name}.log", level=logging.INFO,
                    format="%(created).3f %(name)s %(message)s")
record = {"kind": kind, "output": outputs[0], "device": None}


def lease():
    from ckpteval.engine.gpus import lease_gpu
    return lease_gpu([str(d) for d in range(plan["gpus"])], Path(plan["lock_dir"]),
                     poll_seconds=0.05)


if kind == "infer":
    from ckpteval.engine.assist import Board, work_through
    held = lease()
    record.update(device=held.device, start=time.time())
    load = plan["load"][name]
    # Each task's generation in chunks_per_task chunks (~256 requests each); cost: as seconds.
    secs = [m / plan["chunks_per_task"] for m in plan["generate"][name]
            for _ in range(plan["chunks_per_task"])]
    costs = [max(1, round(s / plan["scale"] * 1000)) for s in secs]
    board = None
    if plan["assist"]:
        board = Board.publish(Path(plan["boards"]), name,
                              info={"chunk_cost": costs, "load_seconds": load},
                              chunks=[{"seconds": s} for s in secs])
    t0 = time.monotonic()
    time.sleep(load)
    state = {"load": time.monotonic() - t0, "engine": 0.0, "cost": 0, "own": 0, "own_end": None}

    def generate(i):
        t = time.monotonic()
        time.sleep(secs[i])
        took = time.monotonic() - t
        state["engine"] += took
        state["cost"] += costs[i]
        state["own"] += 1
        if board is not None:
            board.mark_done(i, took)
            board.report(state["load"], state["engine"], state["cost"])
        state["own_end"] = time.time()

    try:
        assisted = work_through(board, list(range(len(secs))), generate, poll_seconds=0.05)
    finally:
        if board is not None:
            board.leave()
    record.update(chunks=len(secs), own_chunks=state["own"], assisted_chunks=len(assisted),
                  assisted_seconds=sum(s for _, s in assisted), own_end=state["own_end"])
elif kind == "assist":
    from ckpteval.engine.assist import Engine, assist
    held = lease()
    record.update(device=held.device, start=time.time())
    joined = []

    class Sleeper(Engine):
        def __init__(self, entry):
            self.entry = entry

        def generate_chunk(self, chunk):
            time.sleep(chunk["seconds"])
            self.entry["chunks"] += 1
            self.entry["seconds"] += chunk["seconds"]
            return 1

    def open_engine(board):
        info = board.info
        entry = {"job": info["job"], "joined": time.time(), "load": info["load_seconds"],
                 "chunks": 0, "seconds": 0.0}
        joined.append(entry)
        time.sleep(info["load_seconds"])
        return Sleeper(entry)

    stats = assist(Path(plan["boards"]), f"assist-{name}", open_engine,
                   default_load_seconds=plan["default_load"], grace_seconds=plan["grace"],
                   poll_seconds=plan["assist_poll"])
    record.update(boards=stats.boards, chunks=stats.chunks, engine_seconds=stats.engine_seconds,
                  load_seconds=stats.load_seconds, joined=joined)
else:
    record["start"] = time.time()
    time.sleep(seconds)
record["end"] = time.time()
for out in outputs:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record))
"""


SCENARIOS = ("first", "sizes", "remeasure")
#: Decoding cost of a 7B model relative to a 1.7B one (weight bytes, memory-bound decoding).
BIG_MODEL_FACTOR = 7.0 / 1.7
REMEASURE_SIGMA = 0.05


def draw_plan(checkpoints: int, tasks: int, seed: int, scenario: str = "first") -> dict:
    """Seeded durations in simulated minutes (infer per checkpoint, evaluate per cell, aggregate)
    and what ckpteval would know of each infer job before it runs (`known`, `history`)."""
    rng = random.Random(seed)
    names = [f"t{i}" for i in range(tasks)]
    base = [TASK_MINUTES[i % len(TASK_MINUTES)] for i in range(tasks)]
    infer, generate, load, evaluate, known = {}, {}, {}, {}, {}
    history: dict[str, dict[str, list]] = {"small": {}, "big": {}}
    for c in range(checkpoints):
        ckpt, step = f"step_{(c + 1) * 500}", (c + 1) * 500
        run = "big" if scenario == "sizes" and c % 3 == 2 else "small"
        size = BIG_MODEL_FACTOR if run == "big" else 1.0
        gen = [b * size * rng.lognormvariate(0, GEN_SIGMA) for b in base]
        infer[ckpt] = LOAD_MINUTES * size + sum(gen)
        generate[ckpt], load[ckpt] = gen, LOAD_MINUTES * size
        evaluate[ckpt] = {t: EVAL_MEDIAN_MINUTES * rng.lognormvariate(0, EVAL_SIGMA) for t in names}
        known[ckpt] = {
            "run": run,
            "step": step,
            "static": {t: b * size for t, b in zip(names, base)},
        }
        if scenario == "remeasure":
            for t, g in zip(names, gen):
                history[run].setdefault(t, []).append(
                    [step, g * rng.lognormvariate(0, REMEASURE_SIGMA)]
                )
    return {
        "tasks": names,
        "infer": infer,
        "generate": generate,
        "load": load,
        "evaluate": evaluate,
        "aggregate": AGGREGATE_MINUTES,
        "known": known,
        "history": history,
    }


def scaled(plan: dict, scale: float) -> dict:
    """The plan in seconds to sleep."""
    return {
        "tasks": plan["tasks"],
        "infer": {c: m * scale for c, m in plan["infer"].items()},
        "generate": {c: [m * scale for m in ms] for c, ms in plan["generate"].items()},
        "load": {c: m * scale for c, m in plan["load"].items()},
        "evaluate": {
            c: {t: m * scale for t, m in ts.items()} for c, ts in plan["evaluate"].items()
        },
        "aggregate": plan["aggregate"] * scale,
        "known": plan["known"],
        "history": {
            run: {t: [[step, sec * scale] for step, sec in ms] for t, ms in tasks.items()}
            for run, tasks in plan["history"].items()
        },
    }


def lower_bound(plan: dict, gpus: int, cores: int) -> tuple[float, str]:
    """The makespan no schedule can beat, and which term set it (see the module docstring)."""
    gpu_work = sum(plan["infer"].values())
    tail = min(max(ts.values()) for ts in plan["evaluate"].values()) + plan["aggregate"]
    cpu_work = sum(sum(ts.values()) for ts in plan["evaluate"].values())
    chain = max(plan["infer"][c] + max(plan["evaluate"][c].values()) for c in plan["infer"])
    terms = {
        "GPU work / GPUs + shortest tail": gpu_work / gpus + tail,
        "longest chain": chain + plan["aggregate"],
        "CPU work / cores": cpu_work / cores + plan["aggregate"],
    }
    name = max(terms, key=terms.__getitem__)
    return terms[name], name


def simulate(plan: dict, gpus: int, order: list[str]) -> float:
    """Makespan of an overhead-free list schedule that starts infer jobs in `order`.

    Each infer job takes the GPU that frees first; a checkpoint's evaluations start when its infer
    job ends (cores are not the bottleneck here); aggregate starts after the last evaluation.
    """
    free = [0.0] * gpus
    last_eval = 0.0
    for ckpt in order:
        slot = min(range(gpus), key=free.__getitem__)
        free[slot] += plan["infer"][ckpt]
        last_eval = max(last_eval, free[slot] + max(plan["evaluate"][ckpt].values()))
    return last_eval + plan["aggregate"]


GPU_KINDS = ("infer", "assist")


def device_clashes(records: list[dict]) -> int:
    """Pairs of GPU jobs (infer or assist) that held the same fake device at overlapping times."""
    by_device: dict[str, list[dict]] = {}
    for r in records:
        if r["kind"] in GPU_KINDS:
            by_device.setdefault(r["device"], []).append(r)
    clashes = 0
    for held in by_device.values():
        held.sort(key=lambda r: r["start"])
        clashes += sum(1 for a, b in zip(held, held[1:]) if b["start"] < a["end"])
    return clashes


def held_within(records: list[dict], lo: float, hi: float) -> float:
    """Device seconds the GPU jobs among `records` held between `lo` and `hi`."""
    return sum(
        max(0.0, min(r["end"], hi) - max(r["start"], lo)) for r in records if r["kind"] in GPU_KINDS
    )


def run_schedule(args: argparse.Namespace, workdir: Path) -> dict:
    minutes = draw_plan(args.checkpoints, args.tasks, args.seed, args.scenario)
    plan = scaled(minutes, args.scale)
    plan.update(
        gpus=args.gpus,
        lock_dir=str(workdir / "gpu-locks"),
        job_script=str(workdir / "job.py"),
        scale=args.scale,
        assist=args.assist,
        boards=str(workdir / "cache" / ".boards"),
        chunks_per_task=CHUNKS_PER_TASK,
        default_load=LOAD_MINUTES * args.scale,
        grace=ASSIST_GRACE_MINUTES * args.scale,
        assist_poll=max(0.05, ASSIST_POLL_MINUTES * args.scale),
    )
    (workdir / "plan.json").write_text(json.dumps(plan))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "job.py").write_text(JOB_SCRIPT)
    assists = args.gpus - 1 if args.assist else 0
    jobs = 2 * args.checkpoints + args.checkpoints * args.tasks + 1 + assists
    print(
        f"scenario {args.scenario}, assist {'on' if args.assist else 'off'}: "
        f"{args.checkpoints} checkpoints x {args.tasks} tasks = {jobs} jobs "
        f"({args.checkpoints} infer{f' + {assists} assist' if assists else ''} on GPU), "
        f"{args.gpus} fake GPUs, {args.cores} cores, 1 simulated minute = {args.scale} s; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )

    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            str(LOCAL_PROFILE),
            "--resources",
            f"gpu={args.gpus}",
            "--cores",
            str(args.cores),
            "--quiet",
            "all",
        ],
        cwd=workdir,
        text=True,
        capture_output=True,
        check=False,
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"snakemake failed:\n{result.stderr[-3000:]}")

    records = [
        json.loads(p.read_text())
        for sub in ("models", "scores")
        for p in (workdir / sub).rglob("*.json")
    ]
    records += [
        json.loads((workdir / "generations" / c / f"{plan['tasks'][0]}.json").read_text())
        for c in plan["infer"]
    ]
    records.append(json.loads((workdir / "summary.json").read_text()))
    helpers = [json.loads(p.read_text()) for p in sorted((workdir / "assist").glob("*.json"))]
    t0 = min(r["start"] for r in records)
    summary_end = max(r["end"] for r in records)
    # The sweep ends when its last job does: `all` waits for the assist jobs too.
    makespan = max(r["end"] for r in records + helpers) - t0
    bound, term = lower_bound(plan, args.gpus, args.cores)
    infer = [r for r in records if r["kind"] == "infer"]
    infer_lo, infer_hi = min(r["start"] for r in infer), max(r["end"] for r in infer)
    infer_span = infer_hi - infer_lo
    gpu_records = infer + helpers
    started_order = [Path(r["output"]).parts[1] for r in sorted(infer, key=lambda r: r["start"])]
    lpt = simulate(
        plan, args.gpus, sorted(plan["infer"], key=plan["infer"].__getitem__, reverse=True)
    )
    same_order = simulate(plan, args.gpus, started_order)
    step_order = simulate(plan, args.gpus, list(plan["infer"]))
    print(f"snakemake wall (incl. DAG build): {wall:.1f} s")
    print(f"makespan:          {makespan:.2f} s  ({makespan / args.scale:.0f} simulated min)")
    print(f"lower bound:       {bound:.2f} s  ({term})")
    print(f"makespan / bound:  {makespan / bound:.3f}  (target <= 1.10)")
    print(
        f"for reference, overhead-free list schedules without assist: longest-first {lpt:.2f} s "
        f"({lpt / bound:.3f} x bound), in Snakemake's start order {same_order:.2f} s "
        f"({same_order / bound:.3f} x bound), in step order as without priorities {step_order:.2f} s "
        f"({step_order / bound:.3f} x bound)"
    )
    slots = args.gpus * infer_span
    by_assist = held_within(helpers, infer_lo, infer_hi) / slots
    print(
        f"GPU-slot use:      {held_within(gpu_records, infer_lo, infer_hi) / slots:.1%} over the "
        f"infer phase, {held_within(gpu_records, t0, t0 + makespan) / (args.gpus * makespan):.1%} "
        "over the makespan"
        + (f"; assist jobs held {by_assist:.1%} of the infer phase's slots" if helpers else "")
    )
    print(f"device clashes:    {device_clashes(gpu_records)}")
    if args.assist:
        report_assist(plan, infer, helpers, t0, summary_end, args.scale)
    return {"makespan": makespan, "bound": bound}


def report_assist(
    plan: dict, infer: list[dict], helpers: list[dict], t0: float, summary_end: float, scale: float
) -> None:
    """When each assist job ran, whom it helped, and what the helped infer jobs got back."""

    def at(t: float) -> str:
        return f"{(t - t0) / scale:.1f}"

    loads = sum(r["load_seconds"] for r in helpers)
    chunks = sum(r["engine_seconds"] for r in helpers)
    held = sum(r["end"] - r["start"] for r in helpers)
    late = (max((r["end"] for r in helpers), default=summary_end) - summary_end) / scale
    print(
        f"assist jobs:       {len(helpers)}, holding {held / scale:.1f} GPU-min: "
        f"{loads / scale:.1f} loading, {chunks / scale:.1f} generating "
        f"{sum(r['chunks'] for r in helpers)} chunks, the rest idle; the last ended "
        f"{abs(late):.1f} min {'after' if late > 0 else 'before'} the summary "
        "(times below: simulated minutes from the sweep's start)"
    )
    for r in sorted(helpers, key=lambda r: r["start"]):
        visits = (
            ", ".join(
                f"{j['job']} at {at(j['joined'])} ({j['chunks']} chunks, "
                f"{j['seconds'] / scale:.1f} min)"
                for j in r["joined"]
            )
            or "nobody"
        )
        print(
            f"  {Path(r['output']).stem} on GPU {r['device']}: {at(r['start'])}-{at(r['end'])}, "
            f"helped {visits}"
        )
    helped = sorted((r for r in infer if r.get("assisted_chunks")), key=lambda r: r["start"])
    last_infer = sorted(infer, key=lambda r: r["end"])[-3:]
    for r in sorted({id(r): r for r in helped + last_infer}.values(), key=lambda r: r["end"]):
        waited = r["end"] - r["own_end"] if r.get("own_end") else 0.0
        print(
            f"  {Path(r['output']).parts[1]} on GPU {r['device']}: "
            f"{at(r['start'])}-{at(r['end'])}, {r['assisted_chunks']}/{r['chunks']} chunks "
            f"({r['assisted_seconds'] / scale:.1f} min) by assist jobs, "
            f"waited {waited / scale:.1f} min for them at the end"
        )


WORKFLOW_TASKS = {
    "arith": {},
    "pyfunc": {},
    "rustfunc": {},
    "humaneval": {},
    "arith_harness": {},
    "gsm8k": {"harness": "gsm8k"},
    "mbpp": {"harness": "mbpp"},
}


def run_dryrun(jobs: int, workdir: Path) -> None:
    """Time `snakemake -n` on DAGs of about `jobs` jobs: the sweep's shape, and ckpteval's own.

    ckpteval's own: the repository's Snakefile on a run of empty checkpoint directories (marked
    complete) x 7 tasks, so parse-time discovery, config validation and the input functions are
    all in the figure; per checkpoint that is consolidate + infer + 7 evaluate jobs.
    """
    tasks = len(WORKFLOW_TASKS)
    checkpoints = math.ceil((jobs - 2) / (tasks + 2))
    total = checkpoints * (tasks + 2) + 2

    synthetic = workdir / "synthetic"
    synthetic.mkdir()
    plan = scaled(draw_plan(checkpoints, tasks, 0), 0.0)
    plan.update(gpus=8, lock_dir=str(synthetic / "gpu-locks"), job_script=str(synthetic / "job.py"))
    (synthetic / "plan.json").write_text(json.dumps(plan))
    (synthetic / "Snakefile").write_text(SNAKEFILE)
    wall, cpu = _time_dryrun(synthetic, [])
    print(f"dry run, synthetic DAG of {total - 1} jobs: {wall:.1f} s ({cpu:.1f} s CPU)")

    real = workdir / "workflow"
    for c in range(checkpoints):
        ckpt = real / "run" / f"step_{(c + 1) * 100}"
        ckpt.mkdir(parents=True)
        (ckpt / "DONE").touch()
    (real / "config").mkdir()
    (real / "config" / "config.yaml").write_text(
        json.dumps(
            {"runs": {"sweep": {"path": "run", "complete_marker": "DONE"}}, "tasks": WORKFLOW_TASKS}
        )
    )
    wall, cpu = _time_dryrun(
        real, ["--snakefile", str(REPO / "Snakefile"), "--directory", str(real)]
    )
    print(
        f"dry run, ckpteval workflow, {total} jobs ({checkpoints} checkpoints x {tasks} tasks): "
        f"{wall:.1f} s ({cpu:.1f} s CPU)"
    )


def _time_dryrun(cwd: Path, args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one dry run (CPU: what the figure would be on an idle machine)."""
    cpu_before = _children_cpu()
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            str(LOCAL_PROFILE),
            "-n",
            "--quiet",
            "--cores",
            "32",
            "--resources",
            "gpu=8",
            *args,
        ],
        cwd=cwd,
        text=True,
        capture_output=True,
        check=False,
    )
    seconds = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"dry run failed:\n{result.stderr[-3000:]}")
    return seconds, _children_cpu() - cpu_before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario",
        choices=[*SCENARIOS, "all"],
        default="all",
        help="what ckpteval knows of the jobs before they run (see above)",
    )
    parser.add_argument("--checkpoints", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--cores",
        type=int,
        default=32,
        help="cores Snakemake may schedule (jobs only sleep; a GPU node has many)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="seconds per simulated minute")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--assist",
        choices=["on", "off", "both"],
        default="both",
        help="tail assist jobs (ckpteval.engine.assist) on, off, or each in turn",
    )
    parser.add_argument("--dryrun-jobs", type=int, default=10000, help="0 to skip the dry run")
    parser.add_argument("--workdir", type=Path, help="keep files here (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ckpteval-bench-schedule-") as tmp:
        root = args.workdir or Path(tmp)
        scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
        settings = {"on": (True,), "off": (False,), "both": (False, True)}[args.assist]
        for scenario in scenarios:
            figures = {}
            for assist in settings:
                workdir = root / f"sweep-{scenario}-assist-{'on' if assist else 'off'}"
                workdir.mkdir(parents=True, exist_ok=True)
                settings_of_run = {**vars(args), "scenario": scenario, "assist": assist}
                figures[assist] = run_schedule(argparse.Namespace(**settings_of_run), workdir)
                print()
            if len(figures) == 2:
                off, on = figures[False], figures[True]
                print(
                    f"scenario {scenario}: makespan / bound {off['makespan'] / off['bound']:.3f} "
                    f"without assist, {on['makespan'] / on['bound']:.3f} with "
                    f"(makespan x {on['makespan'] / off['makespan']:.3f})"
                )
                print()
        if args.dryrun_jobs:
            (root / "dryrun").mkdir(exist_ok=True)
            run_dryrun(args.dryrun_jobs, root / "dryrun")


if __name__ == "__main__":
    main()
