#!/usr/bin/env python
"""Device time of a generated step kernel against variants of its own source (design experiments
for the step compiler; the README's "choices made by measurement" table cites the results).

    python bench/microbench/stepkernel_variants.py --archs min_gru,mamba

Variants are text transforms of the generated source; each is compiled by NVRTC, swapped into
the same CompiledStep (same buffers and range table) and timed over back-to-back graph replays,
with its outputs compared to the baseline's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def _clock_watchdog(source: str) -> str:
    out = source.replace("unsigned polls = 0;", "const long long start = clock64();")
    out = out.replace("if (++polls > FFK_POLL_LIMIT) __trap();", "if (clock64() - start > (1ll << 31)) __trap();")
    if out.count("clock64() - start") != 2:
        raise SystemExit("clock-watchdog: the flag waits of runtime.cuh are not where this variant expects them")
    return out


def _expect(out: str, source: str, name: str) -> str:
    if out == source:
        raise SystemExit(f"{name}: the generated source has nothing this variant changes")
    return out


SOURCE_VARIANTS = {
    "baseline": lambda s: s,
    # the helpers inlined at every call site are most of the code: call them instead
    "noinline-helpers": lambda s: s.replace(
        "FFK_DEVICE void ffk_prefetch(float* dst", "__device__ __noinline__ void ffk_prefetch(float* dst"
    ).replace(
        "template <int NT, int K>\nFFK_DEVICE void ffk_ll_stage_n",
        "template <int NT, int K>\n__device__ __noinline__ void ffk_ll_stage_n",
    ),
    "no-unroll": lambda s: s.replace("#pragma unroll 4", "#pragma unroll 1"),
    # what the system fence before the host's done words costs
    "no-done-fence": lambda s: re.sub(r"__threadfence_system\(\);(\s*ffk_store_done\()", r"\1", s),
    # the same ordering from lighter instructions: an acquire-release fence (the system fence is
    # sequentially consistent), or a release store of the done word itself
    "done-acq-rel-fence": lambda s: re.sub(
        r"__threadfence_system\(\);(\s*ffk_store_done\()", r'asm volatile("fence.acq_rel.sys;" ::: "memory");\1', s
    ),
    "done-release-store": lambda s: re.sub(
        r"__threadfence_system\(\);\s*ffk_store_done\(([^,]+), epoch\);",
        r'asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(\1), "r"(epoch) : "memory");',
        s,
    ),
    # the flag waits' watchdog as it was before 2026-11-25 (2^31 clock64 cycles, not a count of polls)
    "clock-watchdog": lambda s: _clock_watchdog(s),
    # where a split product's readers spend their time (session 63; run with --base
    # stepkernel-384-threads-split): the partial sums staged 4 words a thread at a time instead of
    # all at once, and, for timing only (their outputs may differ: the row says by how much),
    # staged without waiting for the current epoch, not staged at all, or with no task waiting
    # for its prefetched weight rows. (The K ranges staged as one index space, `stage-one-space`
    # and `stage-one-space-32`, were removed: slower on the H100, session 65, split kernels,
    # bench/h100/2026-12-06-s65/g18/: min_gru 13.7 us against 9.89, gated_ssm 14.83 / 10.99,
    # mamba 29.28 / 26.84)
    "stage-wide-8": lambda s: _expect(
        re.sub(r"ffk_ll_stage_wide<NT, (\d+), \d+>\(", r"ffk_ll_stage_wide<NT, \1, 8>(", s), s, "stage-wide-8"
    ),
    "stage-wide-4": lambda s: _expect(
        re.sub(r"ffk_ll_stage_wide<NT, (\d+), \d+>\(", r"ffk_ll_stage_wide<NT, \1, 4>(", s), s, "stage-wide-4"
    ),
    "stage-x4": lambda s: _expect(
        re.sub(r"ffk_ll_stage_wide<NT, (\d+), \d+>\(", r"ffk_ll_stage_n<NT, \1>(", s), s, "stage-x4"
    ),
    "stage-no-wait": lambda s: _expect(
        s.replace(
            "if (late && ++polls > FFK_POLL_LIMIT) __trap();\n            } while (late);",
            "if (late && ++polls > FFK_POLL_LIMIT) __trap();\n            } while (false);",
        ),
        s,
        "stage-no-wait",
    ),
    "stage-nothing": lambda s: _expect(
        re.sub(r"ffk_ll_stage_wide<NT, \d+, \d+>\(sd, ss, sn, epoch\);", "", s), s, "stage-nothing"
    ),
    # a split product's partial sums (16 slices of 256 rows) with each thread starting its 16 columns
    # at its own one: thread e reads weight 16 e + r, so a warp's lanes hit 2 banks 16 deep
    "skewed-partials": lambda s: _expect(
        re.sub(
            r"(\(16 \* \(e (?:/ 256|% 256\) \+ 4096 \* \(e / 256)\) \+ )r1\)",
            r"\1((r1 + e) & 15))",
            s,
        ),
        s,
        "skewed-partials",
    ),
    "no-copy-wait": lambda s: _expect(
        re.sub(r"ffk_prefetch_wait(_n)?[<(][^;]*;  // this task's prefetched rows and values have landed", "", s),
        s,
        "no-copy-wait",
    ),
}
# compiler settings: (module of framefuse.compiler, constant, value), or a list of them
# the same source compiled with these NVRTC options instead of the build's (engine.FAST_MATH)
COMPILE_VARIANTS = {
    "exact-math": ("-DFFK_EXACT_MATH",),
    "exact-exp": ("-ftz=true", "-prec-div=false", "-prec-sqrt=false", "-DFFK_EXACT_MATH"),
    "approx-div-sqrt": ("-prec-div=false", "-prec-sqrt=false", "-DFFK_EXACT_MATH"),
    "use-fast-math": ("--use_fast_math",),  # NaN in GPT-2's GELU: powf of a negative base
}

# the build's stepkernel-fewer-phases tactic as compiler settings
FEWER_PHASES_SETTINGS = [
    ("codegen", "ALIAS_VIEWS", True),
    ("codegen", "PHASE_ONE_PASS", True),
    ("codegen", "ROOT_IN_ARRAY_WARP", True),
    ("schedule", "RECOMPUTED_SCALARS", 64),
]
SCHEDULE_VARIANTS = {
    "host-write-8": ("schedule", "HOST_WRITE_CHUNK", 8),
    "host-write-4": ("schedule", "HOST_WRITE_CHUNK", 4),
    "host-write-2": ("schedule", "HOST_WRITE_CHUNK", 2),
    "host-write-16": ("schedule", "HOST_WRITE_CHUNK", 16),
    "scalar-cached": ("schedule", "SCALAR_RECOMPUTE_COST", -1),
    "prefetch-by-block": ("codegen", "PREFETCH_BY_WARP", False),
    "prologue-all-groups": ("codegen", "PROLOGUE_GROUPS", 1000),
    "prologue-1-group": ("codegen", "PROLOGUE_GROUPS", 1),
    "prologue-3-groups": ("codegen", "PROLOGUE_GROUPS", 3),
    "reduce-warp-per-element": ("codegen", "SEGMENTED_REDUCE", False),
    "prefetch-kernel-order": ("codegen", "PREFETCH_BY_BLOCK_ORDER", False),
    "absorb-any-product": ("schedule", "ABSORB_DOT_MACS", 1 << 40),
    # the step functions' costs before they were given their exp/div weight (all counted 1)
    "step-ops-cost-1": ("schedule", "EW", "step-ops-cost-1"),
    # every warp-per-element array of a phase starting on warp 0 (before 2026-11-24's change)
    "no-warp-stagger": ("codegen", "STAGGER_WARPS", False),
    # a phase's flagged values staged before its other units are computed
    "stage-first": ("codegen", "COMPUTE_BEFORE_STAGE", False),
    "no-stagger-stage-first": [("codegen", "STAGGER_WARPS", False), ("codegen", "COMPUTE_BEFORE_STAGE", False)],
    # each LayerNorm / RMSNorm computed as its own row before the products that read it (before 2026-11-25)
    "no-norm-fold": ("simplify", "FOLD_NORMS", False),
    # a LayerNorm's variance as E[x²] − E[x]² of the row itself (before 2026-11-25), not of the row
    # shifted by its first element
    "ln-unshifted": ("lower", "LN_SHIFTED", False),
    # values of constants computed in the kernel (before 2026-11-25's FoldConstants)
    "no-const-fold": ("simplify", "FOLD_CONSTANTS", False),
    # a segmented reduction's walk as pairs of halves, not one rotated loop (codegen.PAIRED_WALK;
    # measured 2026-11-26 with the pairs as the default, under the name rotated-walk for the loop)
    "paired-walk": ("codegen", "PAIRED_WALK", True),
    # the scalar rotated walk where the float4 walk applies (before session 21: codegen.VECTOR_WALK)
    "scalar-walk": ("codegen", "VECTOR_WALK", False),
    # the frame's task on the first free block of its level (before session 21: schedule.FRAME_BLOCK_QUIET)
    "frame-block-first": ("schedule", "FRAME_BLOCK_QUIET", False),
    "session-20": [("codegen", "VECTOR_WALK", False), ("schedule", "FRAME_BLOCK_QUIET", False)],
    # attention's softmax weights computed by the row max's warp, a phase and a barrier less (codegen.ROW_FOLLOWERS)
    "row-followers": ("codegen", "ROW_FOLLOWERS", True),
    # a task's views of its own arrays (a product's rows cut out of the staged frame) read where
    # those lie, not copied: a phase and a barrier less in each such task (codegen.ALIAS_VIEWS)
    "alias-views": ("codegen", "ALIAS_VIEWS", True),
    "alias-views+row-followers": [("codegen", "ALIAS_VIEWS", True), ("codegen", "ROW_FOLLOWERS", True)],
    # a phase's products and reductions taken in one pass of the block's warps, fewer lanes an
    # element where that saves a pass (codegen.PHASE_ONE_PASS)
    "phase-one-pass": ("codegen", "PHASE_ONE_PASS", True),
    # a root that reads only its one product, element for element, computed by the lanes that
    # computed it: a phase and a barrier less (codegen.ROOT_IN_ARRAY_WARP)
    "root-in-warp": ("codegen", "ROOT_IN_ARRAY_WARP", True),
    "one-pass": [("codegen", "PHASE_ONE_PASS", True), ("codegen", "ROOT_IN_ARRAY_WARP", True)],
    # a head's or a row's few cheap scalars recomputed by their readers (schedule.RECOMPUTED_SCALARS)
    "recomputed-scalars": ("schedule", "RECOMPUTED_SCALARS", 64),
    # the build's stepkernel-fewer-phases tactic: the four above together
    "fewer-phases": FEWER_PHASES_SETTINGS,
    # a product every block of its reader needs whole computed by each of them where a block's share
    # is at most 2^15 multiply-adds, not published a level earlier (schedule.REPLICATED_DOT_MACS:
    # mamba's x_proj, delta_net's and Jamba's; the build's stepkernel-fewer-levels with fewer-phases)
    "replicated-products": ("schedule", "REPLICATED_DOT_MACS", 1 << 15),
    "fewer-levels": [*FEWER_PHASES_SETTINGS, ("schedule", "REPLICATED_DOT_MACS", 1 << 15)],
    # a warp's rows of a long product that all read one x row with x held in registers
    # (codegen.DOT_X_IN_REGISTERS: the replicated x_proj of fewer-levels, 48 rows of 512 a block)
    # (time it with the fewer-levels schedule as fewer-levels+x-in-registers)
    "x-in-registers": ("codegen", "DOT_X_IN_REGISTERS", True),
    # the residual stream after a split output projection kept and side-stored by the blocks that
    # sum the partial sums (schedule.SPLIT_SUMS_KEPT): a later reader stages N words, not P x N
    # (time it as 384-threads-split+split-sums-kept)
    "split-sums-kept": ("schedule", "SPLIT_SUMS_KEPT", True),
    # a split product in at most 8 / 4 slices (simplify.SPLIT_MAX_SLICES, 16): each reader stages
    # 8 / 4 x N partial sums, the recurrence on 8 / 4 blocks (time it as 384-threads-split+split-slices-8)
    "split-slices-8": ("simplify", "SPLIT_MAX_SLICES", 8),
    "split-slices-4": ("simplify", "SPLIT_MAX_SLICES", 4),
    # outputs as tagged words, no system fence or done word for the blocks that only write outputs
    # (codegen.TAGGED_OUTPUTS)
    "tagged-outputs": ("codegen", "TAGGED_OUTPUTS", True),
    # the frame's x words published before the scalars of x (codegen.EARLY_FRAME_WORDS; time it
    # under a tactic as fewer-phases-tactic+early-frame; the build's stepkernel-fewer-phases-early-frame)
    "early-frame": ("codegen", "EARLY_FRAME_WORDS", True),
    # ... and the first layer's products started on x, the scalars staged for the phase that reads
    # them (codegen.FRAME_SCALARS_LATE; slower, session 66: in g26 and g27 this was `early-frame`, and
    # g27's `early-frame-whole` what `early-frame` is now)
    "early-frame-late-scalars": [("codegen", "EARLY_FRAME_WORDS", True), ("codegen", "FRAME_SCALARS_LATE", True)],
    # a window's Scan inputs staged only up to each block's last position (schedule.SCAN_PREFIX_RANGES)
    "scan-prefix-ranges": ("schedule", "SCAN_PREFIX_RANGES", True),
    # a window's Scan along its own axis, each element running its prefix inside whatever task reads
    # it (before session 24's column scans: simplify.SCAN_COLUMNS)
    "scan-rows": ("simplify", "SCAN_COLUMNS", False),
    # LSTM / GRU / liquid windows unrolled, a cell a position (before session 25's ir.Recur loop: lower.RECUR_WINDOWS)
    "unrolled": ("lower", "RECUR_WINDOWS", False),
    # the recurrences' loops on blocks shared with the other tasks (schedule.RECUR_OWN_BLOCKS)
    "recur-shared-blocks": ("schedule", "RECUR_OWN_BLOCKS", False),
    # R's rows of a recurrence over more / fewer blocks (schedule.RECUR_SMEM_FLOATS, 16K floats a block)
    "recur-8k": ("schedule", "RECUR_SMEM_FLOATS", 8 * 1024),
    "recur-32k": ("schedule", "RECUR_SMEM_FLOATS", 32 * 1024),
    # R that does not fit shared memory read from a copy laid out per block by k (codegen.RECUR_GLOBAL_ROWS_BY_K)
    "recur-global-by-k": ("codegen", "RECUR_GLOBAL_ROWS_BY_K", True),
    # R over up to 128 blocks a layer (schedule.RECUR_MAX_BLOCKS, 32): hidden 1024 holds R on chip
    "recur-128-blocks": [("schedule", "RECUR_MAX_BLOCKS", 128), ("schedule", "RECUR_SMEM_FLOATS", 40 * 1024)],
    # a staged copy mostly of elements nobody reads is read in place for any value (schedule.SPARSE_COPY_ANY)
    "sparse-copy-any": ("schedule", "SPARSE_COPY_ANY", True),
    # a thread's own sum read four positions at a time where a factor is contiguous (the softmax sum; codegen.VECTOR_REDUCE)
    "vector-reduce": ("codegen", "VECTOR_REDUCE", True),
    "row-followers+vector-reduce": [("codegen", "ROW_FOLLOWERS", True), ("codegen", "VECTOR_REDUCE", True)],
    # a thread's own sum whose reads put a warp on one bank starts each element at its own
    # position (attention's scores over a window, Mamba's C · h; codegen.SKEWED_SUM_WALK)
    "skewed-sum": ("codegen", "SKEWED_SUM_WALK", True),
    # every product row a warp, however short (before 2026-11-25's lane segments)
    "no-seg-dot": ("codegen", "SEGMENTED_DOT", False),
    "no-const-fold-no-seg-dot": [("simplify", "FOLD_CONSTANTS", False), ("codegen", "SEGMENTED_DOT", False)],
    # long prefetch copies issued as pieces, one a warp
    # attention's row max and softmax sum recomputed by their readers, not phases of their own (the
    # sum alone is the default)
    "inline-short-reduce": [("schedule", "INLINE_REDUCE_EXTENT", 32), ("schedule", "INLINE_REDUCE_SOURCE_COST", 8)],
    "inline-short-sum": [("schedule", "INLINE_REDUCE_EXTENT", 32), ("schedule", "INLINE_REDUCE_SOURCE_COST", 1)],
    # every short reduction cached as an array of its own (before 2026-11-26's default)
    "no-inline-reduce": ("schedule", "INLINE_REDUCE_EXTENT", 0),
    # attention's output over the window published by a task of its own (a level more a layer; each of its
    # blocks computes the heads of its own elements), the output projection then a plain product
    "replicate-ops-64": ("schedule", "REPLICATE_OPS", 64),
    "copy-pieces-512": ("codegen", "PREFETCH_PIECE_FLOATS", 512),
    "copy-pieces-1024": ("codegen", "PREFETCH_PIECE_FLOATS", 1024),
    "copy-pieces-2048": ("codegen", "PREFETCH_PIECE_FLOATS", 2048),
    # a task whose every block copies the same state values whole (attention's output projection and
    # its two KV caches) on at most REPLICA_FLOATS / (those floats a block) blocks
    "replica-64k": ("schedule", "REPLICA_FLOATS", 64 * 1024),
    "replica-96k": ("schedule", "REPLICA_FLOATS", 96 * 1024),
    "replica-128k": ("schedule", "REPLICA_FLOATS", 128 * 1024),
    "replica-192k": ("schedule", "REPLICA_FLOATS", 192 * 1024),
    "replica-256k": ("schedule", "REPLICA_FLOATS", 256 * 1024),
    "replica-384k": ("schedule", "REPLICA_FLOATS", 384 * 1024),
    "replica-512k": ("schedule", "REPLICA_FLOATS", 512 * 1024),
    # each block issues a group's copies a task ahead in its own order, not the kernel's
    "paced-copies": ("codegen", "PREFETCH_PACED", True),
    # the frame's in-projection kept a level of its own (before 2026-11-26 session 19): no
    # composition of the first layer's products into products of the frame, no frame scalars
    "no-compose": ("simplify", "COMPOSE_INPUT_PRODUCTS", False),
    # composed, the first LayerNorm's 1/σ recomputed by each reading block (the H200 experiment)
    "no-frame-scalars": ("simplify", "PUBLISH_FRAME_SCALARS", False),
    # segmented products at the lanes their row length gives, however many passes the rows take
    "seg-passes": ("codegen", "SEGMENT_ONE_PASS", False),
    # the first LayerNorm's variance from the frame as E[d²] − E[d]² (a second product of x, the
    # mean's row, after R·x), as before 2026-11-26 session 20, not one centred sum of squares
    "uncentred-variance": ("simplify", "CENTRED_VARIANCE", False),
    # a block whose first task is at level 1 (the frame's, a state shift's) issues the copies of
    # its tasks past level 2 only once its tasks up to level 2 are done (codegen._deferred_points)
    "defer-1": [("codegen", "COPIES_AFTER_LEVEL", 1), ("codegen", "COPIES_AHEAD_LEVELS", 1)],
    # ... the frame's block alone
    "defer-frame": ("codegen", "FRAME_BLOCK_COPIES_LATE", True),
    # ... and a block whose first task is at level 1 or 2 those past level 2
    "defer-2": [("codegen", "COPIES_AFTER_LEVEL", 2), ("codegen", "COPIES_AHEAD_LEVELS", 0)],
    # ... and a block whose first task is at level 1 those past level 1
    "defer-1-0": [("codegen", "COPIES_AFTER_LEVEL", 1), ("codegen", "COPIES_AHEAD_LEVELS", 0)],
}
# the build's tactics (engines.fusion.STEPKERNELS) as variants, to time a setting under each; a
# variant name may join several of these and SCHEDULE_VARIANTS with "+" (inline-short-sum+fewer-blocks)
TACTIC_VARIANTS = {
    "fewer-blocks": "stepkernel-fewer-blocks",
    "pieces": "stepkernel-pieces",
    "384-threads": "stepkernel-384-threads",
    "paced": "stepkernel-paced",
    "unframed": "stepkernel-unframed",
    "replica-cap": "stepkernel-replica-cap",
    "views": "stepkernel-views",
    "fewer-phases-tactic": "stepkernel-fewer-phases",
    "384-threads-fewer-phases": "stepkernel-384-threads-fewer-phases",
    "fewer-levels-tactic": "stepkernel-fewer-levels",
    # ... at 384 threads (session 65): a replicated product's elements get more lanes (mamba's
    # x_proj, 48 products of 512: 8 lanes of 64 multiply-adds each, against 4 of 128 at 256 threads,
    # whose phase took 2,757-3,337 cycles in session 53)
    "384-threads-fewer-levels": ("stepkernel-fewer-levels", {"threads": 384}),
    "384-threads-split": "stepkernel-384-threads-split",
    # ... its partial sums' walks not skewed (as session 62 built it)
    "384-threads-split-unskewed": ("stepkernel-384-threads-split", {"skewed_sums": False}),
}
COST_1_OPS = (
    "attention_weight", "attention_finish", "softsign", "mlstm_igate", "mlstm_denominator", "mlstm_m",
    "mlstm_fgate", "gated_delta_state", "delta_rule_state", "linear_scan_step",
)  # fmt: skip


def _variant_value(value):
    if value == "step-ops-cost-1":
        from dataclasses import replace

        from framefuse.compiler.ops import EW

        return {name: replace(spec, cost=1) if name in COST_1_OPS else spec for name, spec in EW.items()}
    return value


VARIANTS = {**SOURCE_VARIANTS, **COMPILE_VARIANTS, **SCHEDULE_VARIANTS}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--archs",
        default="min_gru,mamba",
        help="zoo architectures (ARCH/sequenceT: the sequence form, T frames); real:NAME (real:NAME/sequenceT) "
        "for tests/real_models",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--base",
        default=None,
        help="a tactic of engines.fusion.STEPKERNELS whose kernel the source and compile variants change "
        "(default: the plain stepkernel's)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    from framefuse.compiler import lower_program
    from framefuse.compiler.codegen import KERNEL_NAME
    from framefuse.compiler.engine import CompiledStep
    from framefuse.engines.fusion import example_feeds, time_plan_graph
    from framefuse.engines.stepkernel import StepKernelPlan
    from framefuse.plugins import cuda
    from framefuse.runtime.pipeline import prepare

    root = Path(tempfile.mkdtemp(prefix="ff-variants-"))
    rows = []
    for arch in args.archs.split(","):
        if arch.startswith("real:"):  # a benchmarked real model (bench/e2e.py --section real), T = 1 or /sequenceT
            from types import SimpleNamespace

            from tests.real_models.flow import fuse_real_model

            name, _, steps = arch[5:].partition("/sequence")
            prepared = SimpleNamespace(fused=fuse_real_model(name, int(steps or 1), root).fused_path)
        elif "/sequence" in arch:  # min_gru/sequence32: the sequence form's window of 32 frames as one kernel
            name, _, steps = arch.partition("/sequence")
            prepared = prepare(name, root / arch.replace("/", "-"), {"seq": int(steps or 32)})["sequence"]
        else:
            prepared = prepare(arch, root / arch)["step"]
        if args.base:
            from framefuse.compiler.engine import compile_step
            from framefuse.engines.fusion import STEPKERNELS

            compiled = compile_step(prepared.fused, device=torch.device("cuda"), **STEPKERNELS[args.base])
        else:
            compiled = CompiledStep(lower_program(prepared.fused), device=torch.device("cuda"))
        plan = StepKernelPlan.of(compiled)
        feeds = example_feeds(plan)
        base_fn = compiled.fn
        # every variant's outputs against the base kernel's (before session 66 a variant compared
        # only where a source variant had run first in the process: tactic variants said null)
        reference = {k: v.clone() for k, v in plan.execute(feeds).items()}
        torch.cuda.synchronize()
        for name in args.variants.split(","):
            parts = name.split("+")
            if all(p in SCHEDULE_VARIANTS or p in TACTIC_VARIANTS for p in parts):
                import importlib

                from framefuse.engines.fusion import STEPKERNELS

                settings, tactic = [], {}
                for part in parts:
                    if part in TACTIC_VARIANTS:
                        found = TACTIC_VARIANTS[part]
                        tactic_name, overrides = (found, {}) if isinstance(found, str) else found
                        tactic.update(STEPKERNELS[tactic_name])
                        tactic.update(overrides)
                    else:
                        found = SCHEDULE_VARIANTS[part]
                        settings += found if isinstance(found, list) else [found]
                saved = []
                for module_name, constant, value in settings:
                    sched_module = importlib.import_module(f"framefuse.compiler.{module_name}")
                    saved.append((sched_module, constant, getattr(sched_module, constant)))
                    setattr(sched_module, constant, _variant_value(value))
                try:
                    lowering = {k: tactic.pop(k, None) for k in ("compose_input", "split")}
                    other = CompiledStep(
                        lower_program(prepared.fused, **lowering), device=torch.device("cuda"), **tactic
                    )
                finally:
                    for sched_module, constant, value in reversed(saved):
                        setattr(sched_module, constant, value)
                other_plan = StepKernelPlan.of(other)
                timing = time_plan_graph(other_plan, feeds, replays=1000)
                outs = {k: v.clone() for k, v in other_plan.execute(feeds).items()}
                torch.cuda.synchronize()
                diff = max(float((outs[k] - reference[k]).abs().max()) for k in outs)
                row = {
                    "arch": arch,
                    "variant": name,
                    "us_per_step": timing["us_per_step"],
                    "levels": other.schedule.levels(),
                    "max_abs_diff_vs_baseline": diff,
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
                continue
            options = COMPILE_VARIANTS.get(name, compiled.nvrtc_options)
            source = (
                compiled.kernel.source if name in COMPILE_VARIANTS else SOURCE_VARIANTS[name](compiled.kernel.source)
            )
            path = root / f"{arch.replace('/', '-')}-{name}.cu"
            path.write_text(source)
            compiled.fn = base_fn if name == "baseline" else cuda.get_kernel(path, KERNEL_NAME, options)
            if compiled.kernel.smem_bytes > 48 * 1024:
                compiled.fn.set_max_dynamic_shared_memory(compiled.kernel.smem_bytes)
            timing = time_plan_graph(plan, feeds, replays=1000)
            outs = {k: v.clone() for k, v in plan.execute(feeds).items()}
            torch.cuda.synchronize()
            diff = max(float((outs[k] - reference[k]).abs().max()) for k in outs)
            row = {
                "arch": arch,
                "variant": name,
                "us_per_step": timing["us_per_step"],
                "registers": compiled.fn.attribute("NUM_REGS"),
                "max_abs_diff_vs_baseline": diff,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
