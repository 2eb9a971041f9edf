#!/usr/bin/env python3
"""Writes reports/validation.md: shardsim's simulated training steps against the public
measurements of ../shared/reference/measured-steps.md.

Each simulated case is a run file in configs/validation/ (its header names the measured row).
The table below gives, per case, the measured figure exactly as the source states it (or as
measured-steps.md derives it) and which of shardsim's outputs it is compared with:
  mfu                      MaxText's MFU (TFLOP/s per chip over the chip's peak; MaxText counts
                           6N + attention FLOPs per token, as shardsim's PaLM definition does)
  step_time_s              seconds per step
  tokens_per_s_per_device  torchtitan's words/s per GPU
  tokens_per_s             a serving run's output tokens/s (batch x decode_len over TTFT +
                           (decode_len - 1) TPOT)
The error is simulated / measured - 1. No parameter of shardsim was fitted to these cases: the
devices' efficiencies are the presets' documented defaults.

Usage: reports/validate.py [--shardsim build/shardsim] [--out reports/validation.md]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def megatron_seconds(batch, layers, hidden, tflops, gpus, seq=2048, vocab=51200):
    """measured-steps.md's DERIVED seconds per iteration of Narayanan et al. 2021 (Table 1):
    96·B·s·l·h²·(1 + s/6h + V/16lh) FLOPs (full recompute counted) over the measured
    TFLOP/s per GPU times the GPUs."""
    flops = 96 * batch * seq * layers * hidden**2 * (
        1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return flops / (tflops * 1e12 * gpus)


MAXTEXT_V5P = "MaxText v5p README (2023-12), measured-steps.md TPU v5p table"
MAXTEXT_V5E = "MaxText v5e README, measured-steps.md TPU v5e table (1 slice)"
MAXTEXT_V5E_4 = "MaxText v5e README, measured-steps.md TPU v5e table (4 slices)"
MAXTEXT_V4 = "MaxText v4 README, measured-steps.md TPU v4 line"
TPU_RECIPES = "tpu-recipes trillium, measured-steps.md v6e/v5p table"
MEGATRON = "Narayanan et al. 2021 Table 1 (Selene), measured-steps.md Megatron table (DERIVED s/iter)"
TORCHTITAN = "torchtitan docs/performance.md, measured-steps.md torchtitan table"
JETSTREAM = "jetstream-pytorch on TPU v5e-8, measured-steps.md Serving"
TRTLLM = "TensorRT-LLM 0.5.0 docs/source/performance.md, measured-steps.md Serving"

# (run file stem, what was measured, source, metric, measured value)
CASES = [
    ("maxtext_v5p_32b_64chips", "32B, 64 v5p, TP4 x FSDP16, pdbs 8", MAXTEXT_V5P, "mfu", 0.7147),
    ("maxtext_v5p_64b_64chips", "64B, 64 v5p, TP4 x FSDP16, pdbs 4", MAXTEXT_V5P, "mfu", 0.7031),
    ("maxtext_v5p_128b_128chips", "128B, 128 v5p, TP8 x FSDP16, pdbs 2", MAXTEXT_V5P, "mfu",
     0.6868),
    ("maxtext_v5p_128b_256chips", "128B, 256 v5p, TP8 x FSDP32, pdbs 2", MAXTEXT_V5P, "mfu",
     0.6883),
    ("maxtext_v5e_16b_256chips", "16B, 256 v5e, FSDP256, pdbs 6", MAXTEXT_V5E, "mfu", 0.6110),
    ("maxtext_v5e_32b_256chips", "32B, 256 v5e, FSDP256, pdbs 4", MAXTEXT_V5E, "mfu", 0.6686),
    ("maxtext_v5e_64b_256chips", "64B, 256 v5e, FSDP256, pdbs 2", MAXTEXT_V5E, "mfu", 0.5990),
    ("maxtext_v5e_128b_256chips", "128B, 256 v5e, FSDP16 x TP16, pdbs 1", MAXTEXT_V5E, "mfu",
     0.5606),
    ("maxtext_v5p_32b_2x64chips", "32B, 2 slices x 64 v5p, TP4 x FSDP16, DCN DP2, pdbs 8",
     MAXTEXT_V5P, "mfu", 0.6943),
    ("maxtext_v5e_16b_4x256chips", "16B, 4 slices x 256 v5e, FSDP256, DCN DP4, pdbs 6",
     MAXTEXT_V5E_4, "mfu", 0.5914),
    ("maxtext_v5e_32b_4x256chips", "32B, 4 slices x 256 v5e, FSDP256, DCN DP4, pdbs 4",
     MAXTEXT_V5E_4, "mfu", 0.6410),
    ("maxtext_v5e_64b_4x256chips", "64B, 4 slices x 256 v5e, FSDP256, DCN DP4, pdbs 2",
     MAXTEXT_V5E_4, "mfu", 0.5585),
    ("maxtext_v5e_128b_4x256chips",
     "128B, 4 slices x 256 v5e, FSDP16 x TP16, DCN DP4, pdbs 1", MAXTEXT_V5E_4, "mfu", 0.5493),
    ("maxtext_v4_22b_64chips", "22B, 64 v4, FSDP64, pdbs 16", MAXTEXT_V4, "mfu", 0.567),
    ("tpu_recipes_v6e_gpt3_175b_256chips", "GPT-3 175B, 256 v6e, FSDP256, 3 x 2048",
     TPU_RECIPES, "step_time_s", 17.182),
    ("tpu_recipes_v6e_llama3_1_70b_256chips",
     "Llama3.1-70B, 256 v6e, FSDP256, 5 x 8192, layer input and q/k/v offloaded to host",
     TPU_RECIPES, "step_time_s", 42.656),
    ("tpu_recipes_v5p_llama3_1_405b_512chips",
     "Llama3.1-405B, 512 v5p, FSDP512, 2 x 8192, attention output and MLP output projection "
     "offloaded to host, vocabulary tiling 4", TPU_RECIPES, "step_time_s", 131.474),
    ("tpu_recipes_v6e_mixtral_8x7b_256chips",
     "Mixtral 8x7B, 256 v6e, FSDP256, 12 x 4096, dropping CF 1.25, layer input and "
     "q/k/v/out projections offloaded to host", TPU_RECIPES, "step_time_s", 13.484),
    ("megatron_1_7b_32gpus", "1.7B, 32 A100, DP32, batch 512", MEGATRON, "step_time_s",
     megatron_seconds(512, 24, 2304, 137, 32)),
    ("megatron_7_5b_128gpus", "7.5B, 128 A100, TP4 x DP32, batch 512", MEGATRON, "step_time_s",
     megatron_seconds(512, 36, 4096, 142, 128)),
    ("megatron_39_1b_512gpus", "39.1B, 512 A100, TP8 x PP2 x DP32, batch 1536", MEGATRON,
     "step_time_s", megatron_seconds(1536, 48, 8192, 138, 512)),
    ("megatron_145_6b_1536gpus", "145.6B, 1536 A100, TP8 x PP8 x DP24, batch 2304", MEGATRON,
     "step_time_s", megatron_seconds(2304, 80, 12288, 148, 1536)),
    ("megatron_529_6b_2520gpus", "529.6B, 2520 A100, TP8 x PP35 x DP9, batch 2520", MEGATRON,
     "step_time_s", megatron_seconds(2520, 105, 20480, 163, 2520)),
    ("torchtitan_llama3_8b_64gpus", "Llama3 8B, 64 A100, FSDP64, selective op AC", TORCHTITAN,
     "tokens_per_s_per_device", 2973),
    ("torchtitan_llama3_70b_64gpus", "Llama3 70B, 64 A100, FSDP64, full AC", TORCHTITAN,
     "tokens_per_s_per_device", 331),
    ("torchtitan_llama2_13b_64gpus", "Llama2 13B, 64 A100, FSDP64, no AC", TORCHTITAN,
     "tokens_per_s_per_device", 2162),
    ("jetstream_v5e8_llama3_8b_serve", "serving Llama-3-8B, v5e-8, TP8, batch 128, 1024/1024",
     JETSTREAM, "tokens_per_s", 8249),
] + [
    ("trtllm_h100_llama2_70b_fp8_%d_%d" % (i, o),
     "serving LLaMA-70B, 4 H100, FP8, TP4, batch 64, %d/%d" % (i, o), TRTLLM, "tokens_per_s",
     measured)
    for i, o, measured in [(128, 128, 3317), (128, 2048, 2616), (2048, 128, 843),
                           (2048, 2048, 1583)]
]

# Measured rows not simulated, and why.
NOT_SIMULATED = [
    ("MaxText v5p, 512 chips, 256B", "models.md gives no configuration of MaxText's 256B model"),
    ("MaxText A3 Llama2-7B (1, 4, 16 VMs)",
     "measured-steps.md does not give the runs' batch and sharding"),
    ("nccl-tests all_reduce_perf curves", "collective benchmarks, not training steps (issue 10)"),
]


def simulate(shardsim, stem):
    path = os.path.join("configs", "validation", stem + ".yaml")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        subprocess.run([shardsim, "run", path, "--json", out], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as f:
            return path, json.load(f)


def fmt(metric, value):
    if metric == "mfu":
        return "%.1f%%" % (100 * value)
    if metric == "step_time_s":
        return "%.3f s" % value
    if metric == "tokens_per_s":
        return "%.0f tokens/s" % value
    return "%.0f" % value


def report(shardsim):
    rows = []
    errors = []
    for stem, what, source, metric, measured in CASES:
        path, result = simulate(shardsim, stem)
        simulated = result[metric]
        error = simulated / measured - 1
        errors.append(abs(error))
        rows.append("| %s | `%s` | %s | %s | %s | %+.1f%% | %s |" % (
            what, path, metric, fmt(metric, measured), fmt(metric, simulated), 100 * error,
            "yes" if result["fits"] else "no (%.1f GiB peak)" % (
                result["step_memory"]["peak"] / 2**30)))
    median = statistics.median(errors)
    worst = max(errors)
    worst_case = CASES[errors.index(worst)][1]
    lines = [
        "# Validation: simulated training steps against measured ones",
        "",
        "Generated by `reports/validate.py` (do not edit by hand): each case is a run file in",
        "`configs/validation/`, simulated with `shardsim run FILE --json`, and compared with the",
        "measurement `../shared/reference/measured-steps.md` quotes (source per row below).",
        "Error = simulated / measured - 1. No parameter was calibrated on these cases: device",
        "efficiencies and link figures are the presets' documented defaults (the GPU presets'",
        "NCCL figures were fitted to the public nccl-tests curves, reports/collectives.md, never",
        "to these steps; the A100's fused-attention efficiency is FlashAttention-2's published",
        "50-73% of its peak, taken after these rows showed every A100 run fast, not fitted to",
        "them). MaxText's MFU and shardsim's both count 6N + attention FLOPs per",
        "token; Megatron's step time is",
        "measured-steps.md's DERIVED one (its 96·B·s·l·h² FLOP count over the measured TFLOP/s).",
        "'fits' is shardsim's memory verdict; every measured run fitted, so a 'no' is an error of",
        "shardsim's memory model (see below).",
        "",
        "**Summary: %d cases; median |error| %.1f%%, maximum %.1f%% (%s); targets median <= 10%%, "
        "none beyond 25%%: %s.**" % (
            len(errors), 100 * median, 100 * worst, worst_case,
            "met" if median <= 0.10 and worst <= 0.25 else "not met"),
        "",
        "| measured run | run file | metric | measured | simulated | error | fits |",
        "|---|---|---|---|---|---|---|",
    ] + rows + [
        "",
        "Sources:",
    ]
    for source in sorted({c[2] for c in CASES}):
        lines.append("- " + source)
    lines += [
        "",
        "## Measured rows not simulated",
        "",
        "| measured | why not |",
        "|---|---|",
    ] + ["| %s | %s |" % row for row in NOT_SIMULATED] + [
        "",
        "## Known gaps these cases show",
        "",
        "- FSDP runs beside its compute, within HBM: weight gathers are prefetched a layer",
        "  ahead and a layer's gradient reduce-scatters run while the next layer computes its",
        "  backward (XLA's latency-hiding scheduler and collective pipeliner; FSDP2's streams),",
        "  unless that schedule peaks over HBM: then, as XLA's scheduler keeps to its memory",
        "  limit, each weight is gathered where its layer reads it (README, `schedule`).",
        "  GPT-3 175B on 256 v6e peaks at 30.72 GiB of 29.8 GiB prefetching and at 27.34 GiB",
        "  not: -11.5% (-35.8% with the prefetching schedule, which did not fit), and Mixtral",
        "  8x7B on v6e -8.6% (-17.0%). An FSDP row whose communication fits beside its compute",
        "  within HBM simulates at its compute's pace: 65-68% MFU with full remat on v5e and",
        "  v4, where the runs measured 56-67% (v5e's do not follow the model's size: 61.1%,",
        "  66.9% and 59.9% for 16B, 32B and 64B on one slice), and torchtitan's rows are",
        "  11-20% fast with their communication hidden (Llama3 8B: 0.40 s of it beside 2.27 s",
        "  of compute, so the measured step is 0.48 s longer than the simulated compute",
        "  alone; 16-25% fast before FlashAttention ran at the A100's attention efficiency,",
        "  0.6 against its GEMMs' 0.8). Until the twenty-seventh session each gradient's cast,",
        "  next in program",
        "  order, waited for its reduce-scatter, which exposed them all and put these rows",
        "  1.6 to 14.8 points closer by an error of the schedule. Compute that a",
        "  collective's readers do not need runs beside it (XLA's latency-hiding scheduler,",
        "  Megatron-LM's bulk overlap), which took the v5p TP rows to -2.9% to -0.9% and",
        "  Megatron's TP rows from -13.2% .. -0.1% to -15.6% .. -1.7% (its 2021 runs may not",
        "  have overlapped their tensor all-reduces with the weight gradients). What else",
        "  the measured runs lose beside their compute is not modelled; among the candidates,",
        "  the HBM bandwidth the collectives' copies take from the kernels beside them, the",
        "  reductions' work on the TensorCore (TPU presets take `comm_compute_slowdown` 0),",
        "  ICI links below their datasheet rate, and compute kernels below the presets'",
        "  assumed efficiency (every A100 row, Megatron-LM's and torchtitan's alike, is",
        "  still fast). No preset parameter was refitted to these rows.",
        "- Memory: every measured run fitted; the rows above with `fits: no` peak over HBM.",
        "  The MaxText TP runs split the residual stream over `tensor` as MaxText does",
        "  (`activation_embed: tensor`) and still keep more than the measured runs did, with",
        "  MaxText's `minimal` remat run as shardsim's `selective` (next item; 32B on 64 v5p",
        "  holds 84 GiB of activations and temporaries, a 91.7 GiB peak against 89.4 GiB, and",
        "  23.6 GiB with full remat); which values the two policies keep differently is not",
        "  traced. The offloading tpu-recipes runs peak in one large temporary",
        "  outside the per-layer activations (README). torchtitan's Llama2 13B without",
        "  activation checkpointing holds 120 GiB of activations at its local batch of 2 x 8192",
        "  (Korthikanti et al.'s count without recompute, 34sbh bytes a layer with flash",
        "  attention, is 114 GB over its 40 layers), so the",
        "  measured configuration as given does not fit 80 GB. Times are simulated all the same.",
        "- MaxText's `minimal` remat is run as shardsim's `selective` (matmul outputs kept).",
        "  torchtitan's selective-op checkpointing runs as the custom policy that saves what it",
        "  saves (`remat: {save: [query_proj, value_proj, context, mlpwi_0, mlpwo]}`: every",
        "  second matmul of a layer recomputed, the attention's output kept).",
        "- Megatron-LM (2021) ran attention unfused (the s x s scores through softmax and",
        "  dropout in HBM): its run files say `attention: unfused`, which prices those bytes;",
        "  its 2021 kernels are priced at the presets' matmul efficiency. The paper's table gives",
        "  neither the microbatch size nor the pipeline schedule of its pipelined rows: the run",
        "  files assume one sequence per microbatch and 1F1B.",
        "- Serving: jetstream batches continuously and prefills in chunks; shardsim runs one",
        "  prefill of the whole batch, then decode steps at the mean context.",
        "- TensorRT-LLM's rows run `attention: mmha`, chosen after seeing these measurements:",
        "  between the 128- and 2048-token prompts its decode step grows by about 7 us per",
        "  context position, eight times the bytes of the FP8 cache it attends over, and",
        "  TensorRT-LLM 0.5's generation kernel (masked multi-head attention, which its later",
        "  XQA kernel replaced for grouped-query models) reads a kv head's cache once for each of",
        "  the 8 query heads sharing it. The factor is N / K of the model, not a fitted number.",
        "  With the default flash kernel (one read per kv head) the four rows are -2.6%, +33.9%,",
        "  +25.6% and +80.7%. Its FP8 runs are otherwise priced from the H100 preset's FP8",
        "  FLOP/s (hardware.md) and byte counts of the f8e4m3 weights and cache; the activations'",
        "  quantization is fused into the kernels before (free), as TensorRT-LLM runs it.",
        "",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shardsim", default=os.path.join(ROOT, "build", "shardsim"))
    parser.add_argument("--out", default=os.path.join(ROOT, "reports", "validation.md"))
    args = parser.parse_args()
    text = report(os.path.abspath(args.shardsim))
    with open(args.out, "w") as f:
        f.write(text)
    print(next(line for line in text.splitlines() if line.startswith("**Summary")))


if __name__ == "__main__":
    sys.exit(main())
