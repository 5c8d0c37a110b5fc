#!/usr/bin/env python3
"""Compare kit's capacity planner with the figures vLLM printed in public start-up logs.

Reads tests/data/kv_points.json (each point: source, inputs, reported figures) and the model
configs under tests/data/models/, and prints one row per point:

  * bytes/token: does our KV layout turn vLLM's own "Available KV cache memory" into exactly the
    "GPU KV cache size" it printed (within the rounding of the printed GiB)? Likewise the
    "N GiB KV cache is needed" of a failed start.
  * capacity: our predicted KV tokens (from GPU size, utilization, TP, max_model_len alone)
    against the reported tokens, for V1-engine points that give those inputs.

Each point is either "fit" (its figures were used to choose kit's overhead constants) or
"check" (never used for fitting); the figure that counts is the share of V1 checking points
within +-10 %. Exit status 1 when bytes/token is not exact everywhere or that share is below
80 %.

Usage: python3 scripts/plan_accuracy.py [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.plan.capacity import (  # noqa: E402
    BLOCK_SIZE,
    GIB,
    KV_CACHE_DTYPE_BYTES,
    CapacityReport,
    kv_layout,
    model_dtype_bytes,
    plan_capacity,
)
from kit.plan.modelinfo import inspect_model_dir  # noqa: E402

POINTS_FILE = ROOT / "tests" / "data" / "kv_points.json"
MODELS_DIR = ROOT / "tests" / "data" / "models"
PRINTED_GIB_HALF_STEP = 0.005  # vLLM prints GiB with two decimals
CAPACITY_TOLERANCE = 0.10
REQUIRED_CHECK_SHARE = 0.80  # of V1 checking points within CAPACITY_TOLERANCE


@dataclass(frozen=True)
class Evaluation:
    """One point: what vLLM printed and what kit computes from the same inputs."""

    point: dict
    kv_bytes_per_token: int
    tokens_from_reported_memory: tuple[int, int] | None  # range over the printed rounding
    needed_gib: float | None  # KV one max_model_len request needs ("... GiB is needed")
    longest_from_reported_memory: int | None
    report: CapacityReport | None  # the full prediction, when the point gives the inputs

    @property
    def reported(self) -> dict:
        return self.point["reported"]

    @property
    def bytes_per_token_exact(self) -> bool | None:
        """Whether every figure derived from the reported memory matches vLLM's exactly."""
        checks = []
        if self.tokens_from_reported_memory and "kv_tokens" in self.reported:
            low, high = self.tokens_from_reported_memory
            checks.append(low <= self.reported["kv_tokens"] <= high)
        if self.needed_gib is not None:
            checks.append(abs(self.needed_gib - self.reported["kv_needed_gib"])
                          <= PRINTED_GIB_HALF_STEP)
        if self.longest_from_reported_memory is not None:
            checks.append(self.longest_from_reported_memory
                          == self.reported["estimated_max_model_len"])
        return all(checks) if checks else None

    @property
    def capacity_asserted(self) -> bool:
        """Capacity is held to the tolerance for V1 points that started and give all inputs."""
        return (self.report is not None and self.point["engine"] == "v1"
                and not self.reported.get("fails") and "kv_tokens" in self.reported)

    @property
    def role(self) -> str:
        return self.point["role"]

    @property
    def within_tolerance(self) -> bool:
        error = self.capacity_error
        return error is not None and abs(error) <= CAPACITY_TOLERANCE

    @property
    def capacity_error(self) -> float | None:
        if self.report is None or "kv_tokens" not in self.reported:
            return None
        return self.report.kv_cache_tokens / self.reported["kv_tokens"] - 1


def load_points() -> list[dict]:
    return json.loads(POINTS_FILE.read_text())["points"]


def evaluate(point: dict) -> Evaluation:
    model = inspect_model_dir(MODELS_DIR / point["model_dir"])
    element_bytes = model_dtype_bytes(model, point["dtype"])
    kv_bytes = KV_CACHE_DTYPE_BYTES[point["kv_cache_dtype"]] or element_bytes
    layout = kv_layout(model, point["tensor_parallel"], kv_bytes)
    reported = point["reported"]
    batched = point.get("max_num_batched_tokens") or 8192
    token_range = longest = needed = None
    if "available_kv_gib" in reported:
        printed = reported["available_kv_gib"]
        token_range = (layout.tokens((printed - PRINTED_GIB_HALF_STEP) * GIB),
                       layout.tokens((printed + PRINTED_GIB_HALF_STEP) * GIB))
        if "estimated_max_model_len" in reported:
            longest = layout.longest_request(printed * GIB, batched, point["max_model_len"])
    if "kv_needed_gib" in reported:
        blocks = layout.blocks_per_request(point["max_model_len"], batched)
        needed = blocks * layout.group_size * BLOCK_SIZE * layout.layer_bytes / GIB
    report = None
    if point.get("gpu_memory_gib"):
        report = plan_capacity(
            model,
            gpu_memory_gib=point["gpu_memory_gib"],
            tensor_parallel=point["tensor_parallel"],
            gpu_memory_utilization=point["gpu_memory_utilization"],
            max_model_len=point["max_model_len"],
            kv_cache_dtype=point["kv_cache_dtype"],
            quantization=point["quantization"],
            dtype=point["dtype"],
            max_num_batched_tokens=point.get("max_num_batched_tokens"),
            max_num_seqs=point.get("max_num_seqs"),
            cuda_graphs_in_budget=point["cuda_graphs_in_budget"],
            expert_parallel=point.get("expert_parallel", False),
            data_parallel=point.get("data_parallel", 1),
            gpu_name=point.get("gpu"),
        )
    return Evaluation(point, layout.bytes_per_token, token_range, needed, longest, report)


def _row(evaluation: Evaluation) -> list[str]:
    point, reported, report = evaluation.point, evaluation.reported, evaluation.report
    exact = {True: "exact", False: "MISMATCH", None: "-"}[evaluation.bytes_per_token_exact]
    error = evaluation.capacity_error
    if report is None:
        verdict = "n/a (no GPU size)"
    elif not evaluation.capacity_asserted:
        failed = "predicts failure" if report.errors else "predicts start"
        verdict = (f"{point['engine']}: shown only" if point["engine"] != "v1"
                   else f"vLLM failed; kit {failed}")
    else:
        verdict = "ok" if evaluation.within_tolerance else "OUT OF TOLERANCE"
    return [
        point["id"],
        point["role"],
        f"{point.get('gpu', '-')}, tp {point['tensor_parallel']}, "
        f"{point.get('gpu_memory_utilization', '-')}, {point['max_model_len']}, "
        f"kv {point['kv_cache_dtype']}",
        f"{evaluation.kv_bytes_per_token:,}",
        exact,
        f"{reported['weights_gib']:.2f}" if "weights_gib" in reported else "-",
        f"{report.weights_gib:.2f}" if report else "-",
        f"{reported['activation_gib']:.2f}" if "activation_gib" in reported else "-",
        f"{report.activation_gib:.2f}" if report else "-",
        f"{reported['available_kv_gib']:.2f}" if "available_kv_gib" in reported else "-",
        f"{report.kv_cache_gib:.2f}" if report else "-",
        f"{reported['kv_tokens']:,}" if "kv_tokens" in reported else "-",
        f"{report.kv_cache_tokens:,}" if report else "-",
        f"{error:+.1%}" if error is not None else "-",
        verdict,
    ]


HEADER = ["point", "role", "GPU, tp, util, max_model_len, kv", "bytes/token",
          "bytes/token check", "weights GiB (vLLM)", "weights GiB (kit)",
          "activation GiB (vLLM)", "activation GiB (kit)", "KV GiB (vLLM)", "KV GiB (kit)",
          "KV tokens (vLLM)", "KV tokens (kit)", "tokens error", "capacity"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    evaluations = [evaluate(point) for point in load_points()]
    rows = [_row(evaluation) for evaluation in evaluations]
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
        for row in [HEADER, *rows]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    exact = [e.bytes_per_token_exact for e in evaluations if e.bytes_per_token_exact is not None]
    print(f"\n{len(evaluations)} points; bytes/token exact on {sum(exact)} of {len(exact)}")
    share = {}
    for role in ("fit", "check"):
        asserted = [e for e in evaluations if e.capacity_asserted and e.role == role]
        errors = [abs(e.capacity_error) for e in asserted]
        share[role] = check_share(evaluations, role)
        print(f"{role} points (V1): {sum(e.within_tolerance for e in asserted)} of {len(asserted)}"
              f" within +-{CAPACITY_TOLERANCE:.0%} ({share[role]:.0%}); worst "
              f"{max(errors):.1%}, mean |error| {sum(errors) / len(errors):.1%}")
    print(f"figure: {share['check']:.0%} of the V1 checking points within "
          f"+-{CAPACITY_TOLERANCE:.0%} of vLLM's KV tokens (bar {REQUIRED_CHECK_SHARE:.0%})")
    return 0 if all(exact) and share["check"] >= REQUIRED_CHECK_SHARE else 1


def check_share(evaluations: list[Evaluation], role: str = "check") -> float:
    """Share of the V1 points of `role` whose predicted KV tokens are within tolerance."""
    asserted = [e for e in evaluations if e.capacity_asserted and e.role == role]
    return sum(e.within_tolerance for e in asserted) / len(asserted)


if __name__ == "__main__":
    sys.exit(main())
