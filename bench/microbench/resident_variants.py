#!/usr/bin/env python
"""Session.step with the step kernel resident (Session(resident=True)) against variants of the
resident kernel's code generation and of its binding's frame memory (write-combined), in one
process on one engine per architecture: each variant's outputs must equal the launched kernel's
bit for bit over 200 frames, then its step is timed the way bench/e2e.py times every engine. The launched kernel's Session.step is timed beside them.

    python bench/microbench/resident_variants.py --archs min_gru,gru --out /tmp/rv.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# codegen settings of each variant (RESIDENT_WEIGHTS_ONCE, RESIDENT_PREFETCH_EARLY, RESIDENT_TAGGED_FRAMES),
# the binding's (engines/stepkernel.RESIDENT_WRITE_COMBINED_FRAMES), codegen.TAGGED_OUTPUTS, the
# resident binding's engines/stepkernel.RESIDENT_TAGGED_OUTPUTS, codegen.EARLY_FRAME_WORDS,
# codegen.RESIDENT_FRAMER_GO and codegen.RESIDENT_LEADER_LAST
# The variants after resident-untagged keep the twin off, as they were timed before session 67: compare
# them with resident-untagged.
VARIANTS = {
    "default": (True, True, True, False, False, True, False, True, True),
    # session 65: the resident binding's own kernel with tagged outputs beside the engine's untagged
    # launched kernel (stepkernel.RESIDENT_TAGGED_OUTPUTS; the launched step is the same as default's);
    # the default since session 67, which resident-untagged is without
    "resident-tagged-outputs": (True, True, True, False, False, True, False, False, False),
    "resident-untagged": (True, True, True, False, False, False, False, False, False),
    "untagged-frames": (True, True, False, False, False, False, False, False, False),  # the default before session 46
    "weights-every-frame": (False, True, True, False, False, False, False, False, False),
    "prefetch-after-go": (True, False, True, False, False, False, False, False, False),
    "neither": (False, False, True, False, False, False, False, False, False),
    # session 59: the frame words and bell write-combined
    "write-combined": (True, True, True, True, False, False, False, False, False),
    # session 61: outputs as tagged words, no system fence and no done word for the blocks that only
    # write outputs. A setting of the launched kernel too (the engine is built again with it), so
    # its launched step is timed beside as "launched-tagged-outputs".
    "tagged-outputs": (True, True, True, False, True, False, False, False, False),
    # session 64: tagged outputs with the head's outputs in chunks of 16 / 32 floats a block
    # (schedule.HOST_WRITE_CHUNK, 8): a block's words are whole 128-byte host lines (16) or the
    # whole head on one block (32), not two blocks' words in one line
    "tagged-outputs-16": (True, True, True, False, True, False, False, False, False),
    "tagged-outputs-32": (True, True, True, False, True, False, False, False, False),
    # session 66: the frame's x words published before the scalars of x, and the first layer's
    # products started on them (codegen.EARLY_FRAME_WORDS; launched too: "launched-early-frame"),
    # with and without the resident binding's tagged outputs
    "early-frame": (True, True, True, False, False, False, True, False, False),
    "early-frame-resident-tagged": (True, True, True, False, False, True, True, False, False),
    # session 68: the default without the frame block's go (codegen.RESIDENT_FRAMER_GO): the
    # leader's go after its poll of the bell only, as every variant above but default has it
    "leader-go": (True, True, True, False, False, True, False, False, False),
    # session 68: the framer's go with the leader the first block that reads no frame, not the one
    # that joins the frame last (codegen.RESIDENT_LEADER_LAST, on since session 68; g37 timed it as
    # "leader-last" against this as "default")
    "leader-first": (True, True, True, False, False, True, False, True, False),
    # session 68: the default with the frame's x words published before the scalars of x
    # (codegen.EARLY_FRAME_WORDS; launched too, as "launched-early-frame-go"): timed resident in
    # session 66 before the frame block's go, when the other blocks took the go 0.5-2.6 us after
    # the frame block had its words, so nothing could start on them early
    "early-frame-go": (True, True, True, False, False, True, True, True, True),
}
# codegen module settings of a variant besides the tuple's, restored after it (the resident kernel
# only: its sums may then come in another order than the launched kernel's, so such a variant is
# compared by its largest difference, `_max_diff`, not bit for bit)
CODEGEN_EXTRA = {
    # session 68: a root reducing over 16 to 31 (mamba's SSM state, 16) a thread per element looping
    # over them, not a warp per element (codegen.WARP_SPLIT_MIN 32, 16 since session 68; g37 timed
    # 16 as "warp-roots-16" against 32 as "default")
    "warp-roots-32": {"WARP_SPLIT_MIN": 32},
    # session 69: every commit group's copies issued while the frame is awaited, none between
    # tasks, in every kernel / in none (codegen.RESIDENT_COPIES_AT_START_GROUPS 0 / None; since
    # session 70 the default issues them so in kernels of 10 or more groups; the same arithmetic,
    # so bit for bit). Session 69's issue-call variants (every commit point a call of one
    # function) were slower on all 11 archs in session 70's g43, and session 70's dispatch (a
    # block's tasks reached from a switch on its task mask) slower on 9 of 11 in g44: both removed.
    "copies-at-start": {"RESIDENT_COPIES_AT_START_GROUPS": 0},
    "copies-between": {"RESIDENT_COPIES_AT_START_GROUPS": None},
    # session 71: the next frame poll issued beside a relaxed read of the stop word
    # (codegen.RESIDENT_POLL_AHEAD; session 70's paced re-polls of wide stages, "backoff-*", were
    # slower on all three kernels they change in g47/g48 and are removed)
    "poll-ahead": {"RESIDENT_POLL_AHEAD": True},
    # session 72: each frame block replicated on a free block that polls a second copy of the frame
    # words RESIDENT_REPLICA_DELAY cycles behind it (codegen.RESIDENT_FRAMER_REPLICAS; the same
    # arithmetic, so bit for bit), at the default delay (1,100 cycles) and two others
    "replicas": {"RESIDENT_FRAMER_REPLICAS": True},
    "no-replicas": {"RESIDENT_FRAMER_REPLICAS": False},  # (the default since session 72 has them)
    "replicas-600": {"RESIDENT_FRAMER_REPLICAS": True, "RESIDENT_REPLICA_DELAY": 600},
    "replicas-1600": {"RESIDENT_FRAMER_REPLICAS": True, "RESIDENT_REPLICA_DELAY": 1600},
    # session 72: two replicas a frame block, a third and two thirds of a poll period behind it
    # (codegen.RESIDENT_REPLICAS_PER_FRAME_BLOCK 2; untimed)
    "two-replicas": {"RESIDENT_FRAMER_REPLICAS": True, "RESIDENT_REPLICAS_PER_FRAME_BLOCK": 2},
}
VARIANTS["warp-roots-32"] = VARIANTS["default"]
VARIANTS["copies-at-start"] = VARIANTS["default"]
VARIANTS["copies-between"] = VARIANTS["default"]
VARIANTS["poll-ahead"] = VARIANTS["default"]
for _name in ("replicas", "no-replicas", "replicas-600", "replicas-1600", "two-replicas"):
    VARIANTS[_name] = VARIANTS["default"]
# schedule.HOST_WRITE_CHUNK of a variant (the others: the module's own); only variants whose engine
# is built again (tagged outputs) may set it
HOST_WRITE_CHUNKS = {"tagged-outputs-16": 16, "tagged-outputs-32": 32}


def _settings(codegen, values, host_write_chunk: int) -> None:
    from framefuse.compiler import schedule
    from framefuse.engines import stepkernel

    codegen.RESIDENT_WEIGHTS_ONCE, codegen.RESIDENT_PREFETCH_EARLY, codegen.RESIDENT_TAGGED_FRAMES = values[:3]
    stepkernel.RESIDENT_WRITE_COMBINED_FRAMES = values[3]
    codegen.TAGGED_OUTPUTS = values[4]
    stepkernel.RESIDENT_TAGGED_OUTPUTS = values[5]
    codegen.EARLY_FRAME_WORDS = values[6]
    codegen.RESIDENT_FRAMER_GO = values[7]
    codegen.RESIDENT_LEADER_LAST = values[8]
    schedule.HOST_WRITE_CHUNK = host_write_chunk


def main() -> int:
    import tempfile

    from e2e import measure

    from framefuse.compiler import codegen, schedule
    from framefuse.engines import cuda_graph, hostpath
    from framefuse.runtime.pipeline import prepare
    from framefuse.runtime.session import Session

    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="min_gru,gru,attention,mamba")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--variants", default="default,untagged-frames", help=f"of {','.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=2, help="each variant timed this many times, in turn")
    parser.add_argument(
        "--sms", default="", help="also time the default variant on these SM counts (resident_sms=), e.g. 66,33"
    )
    parser.add_argument("--sessions", type=int, default=1, help="sessions of each variant (name/2, name/3 ...)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    root = Path(tempfile.mkdtemp(prefix="framefuse-rv-"))
    chunk = schedule.HOST_WRITE_CHUNK
    for name in args.variants.split(","):
        if name in HOST_WRITE_CHUNKS and not VARIANTS[name][4]:
            raise SystemExit(f"{name}: a host write chunk needs an engine built again (tagged outputs)")
    for arch in args.archs.split(","):
        prepared = prepare(arch, root / arch)["step"]
        engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
        compiled = engine.default_plan.compiled
        shape = prepared.manifest["inputs"][0]["shape"]
        pool = np.random.default_rng(0).standard_normal((64, *shape)).astype(np.float32)
        launched = Session(engine, budget_ms=None)
        expected = [launched.step(pool[i % 64]).copy() for i in range(200)]
        launched.reset()
        variants = args.variants.split(",")
        row = {"arch": arch, "launched": [], **{name: [] for name in variants}}
        sessions = {}
        # each variant's sessions (--sessions): the same kernel's p50 differs by ~1 us between sessions
        for name, key in [(n, n if i == 0 else f"{n}/{i + 1}") for n in variants for i in range(args.sessions)]:
            _settings(codegen, VARIANTS[name], HOST_WRITE_CHUNKS.get(name, chunk))
            if VARIANTS[name][4] or VARIANTS[name][6]:  # the launched kernel's setting too: an engine of its own
                tagged_engine = cuda_graph.build(prepared.fused, device="cuda", options={"select": "stepkernel"})
                kernel = tagged_engine.default_plan.compiled.kernel
                assert kernel.tagged_outputs == VARIANTS[name][4] and kernel.settings.early_frame == VARIANTS[name][6]
                sessions[f"launched-{name}"] = Session(tagged_engine, budget_ms=None)
                got = [sessions[f"launched-{name}"].step(pool[i % 64]).copy() for i in range(200)]
                row[f"launched-{name}_equal"] = all(np.array_equal(a, b) for a, b in zip(got, expected))
                sessions[f"launched-{name}"].reset()
                row[f"launched-{name}"] = []
                session = Session(tagged_engine, budget_ms=None, resident=True)
            else:
                if key == name:  # a variant's later sessions run the kernel its first one compiled
                    compiled.forget_resident()  # generated and compiled again with these settings
                extra = CODEGEN_EXTRA.get(name, {})
                saved = {setting: getattr(codegen, setting) for setting in extra}
                for setting, value in extra.items():
                    setattr(codegen, setting, value)
                try:
                    session = Session(engine, budget_ms=None, resident=True)
                finally:
                    for setting, value in saved.items():
                        setattr(codegen, setting, value)
            if VARIANTS[name][3] and not session._host_step.write_combined:
                raise SystemExit(
                    f"{name}: the binding is not write-combined (hostpath.c not built: {hostpath.status()})"
                )
            got = [session.step(pool[i % 64]).copy() for i in range(200)]
            row[f"{key}_equal"] = all(np.array_equal(a, b) for a, b in zip(got, expected))
            copies = session._host_step.resident_kernel.frame_copies
            if copies != 1:  # (codegen.RESIDENT_FRAMER_REPLICAS: only where the grid has free blocks)
                row[f"{key}_frame_copies"] = copies
            if name in CODEGEN_EXTRA:
                row[f"{key}_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(got, expected))
            session.close()
            session.reset()
            sessions[key] = session
            row.setdefault(key, [])
        _settings(codegen, VARIANTS["default"], chunk)
        compiled.forget_resident()
        for sms in [int(v) for v in args.sms.split(",") if v]:
            name = f"sms-{sms}"
            session = Session(engine, budget_ms=None, resident=True, resident_sms=sms)
            got = [session.step(pool[i % 64]).copy() for i in range(200)]
            # another grid sums in another order: compared within 1e-5, not bit for bit
            row[f"{name}_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(got, expected))
            session.close()
            session.reset()
            sessions[name] = session
            row[name] = []
        for _ in range(args.rounds):
            row["launched"].append(
                measure(lambda i, s=launched, p=pool: s.step(p[i % 64]), iters=args.iters, warmup=args.warmup)
            )
            for name, session in sessions.items():
                row[name].append(
                    measure(lambda i, s=session, p=pool: s.step(p[i % 64]), iters=args.iters, warmup=args.warmup)
                )
                session.close()
        for session in sessions.values():
            session.close()
        line = "  ".join(
            f"{name} {min(r['p50_us'] for r in row[name]):.1f}/{min(r['p99_us'] for r in row[name]):.1f}"
            for name in ["launched", *sessions]
        )
        diffs = {k: v for k, v in row.items() if k.endswith(("_max_diff", "_frame_copies"))}
        print(
            f"{arch}: p50/p99 us (best round) {line}; equal { ({k[:-6]: v for k, v in row.items() if k.endswith('_equal')}) }; "
            f"{diffs}",
            flush=True,
        )
        rows.append(row)
        launched = engine = None
        if args.out:  # after every arch: a call cut by its time limit keeps the archs it finished
            Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
