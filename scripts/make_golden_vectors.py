"""Write golden vectors from the pure-Python reference planner into tests/data/.

    python scripts/make_golden_vectors.py [path/to/transfer_plan.py]

For a wide, seeded set of layouts it records what the reference does: the plan of every
decode rank (every field, fragment and dict order kept), the private fanout table and the
wire frames of every (decode rank, prefill rank) fragment list; or that it rejected the layout
(UnsupportedPDLayoutError) or crashed (any other exception). The tests read only the output, so
they never need the reference itself.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = ROOT.parent / "shared" / "reference" / "transfer_plan.py"
OUTPUT = ROOT / "tests" / "data" / "golden_vectors.json"
KINDS = ["target_k", "target_v", "draft_k", "draft_v", "mamba_state"]
TP_SIZES = [1, 2, 4, 8, 16] * 3 + [3, 6]


def load_reference(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("reference_transfer_plan", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the reference from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def buffer_fields(
    index: int, kind: str, axis: str, size: int, bpu: int, stride: int, replica: int, page: int = 16
) -> list[Any]:
    return [index, kind, axis, size, page, bpu, stride, replica]


def sharded_pair(
    rng: random.Random,
    index: int,
    kind: str,
    axis: str,
    heads: int,
    prefill_tp: int,
    decode_tp: int,
    bpu: int,
) -> tuple[list[Any], list[Any]]:
    """A buffer both sides shard, replica groups derived as a runtime would."""
    sides = []
    for tp in (prefill_tp, decode_tp):
        replica = max(1, tp // heads) if tp > heads else 1
        shards = tp // replica
        local = (
            heads // shards if shards and heads % shards == 0 else max(1, heads // max(shards, 1))
        )
        padding = rng.choice([0, 0, 0, bpu, 7])
        sides.append(buffer_fields(index, kind, axis, heads, bpu, local * bpu + padding, replica))
    return sides[0], sides[1]


def replicated_pair(rng: random.Random, index: int, kind: str) -> tuple[list[Any], list[Any]]:
    size = rng.choice([1, 4, 576])
    bpu = rng.choice([2, 32, 64])
    stride = size * bpu
    return (
        buffer_fields(index, kind, "replicated", size, bpu, stride + rng.choice([0, 64]), 1),
        buffer_fields(index, kind, "replicated", size, bpu, stride, 1),
    )


def random_layout(rng: random.Random) -> dict[str, Any]:
    prefill_tp = rng.choice(TP_SIZES)
    decode_tp = rng.choice(TP_SIZES)
    prefill_dp = rng.choice([1, 1, 2, 3])
    decode_dp = rng.choice([1, 1, 2, prefill_dp])
    heads = rng.choice([1, 2, 4, 8, 16, 32] * 2 + [3, 6])
    bpu = rng.choice([1, 8, 256, 4096])
    prefill_buffers: list[list[Any]] = []
    decode_buffers: list[list[Any]] = []
    for index in range(rng.randint(1, 6)):
        kind = rng.choice(KINDS)
        axis = rng.choice(["kv_head", "kv_head", "state_channel", "replicated"])
        if axis == "replicated":
            p, d = replicated_pair(rng, index, kind)
        else:
            size = heads if axis == "kv_head" else rng.choice([heads, 12, 48, 64])
            p, d = sharded_pair(rng, index, kind, axis, size, prefill_tp, decode_tp, bpu)
        prefill_buffers.append(p)
        decode_buffers.append(d)
    if rng.random() < 0.15:
        # Garbage a runtime might pass: the reference rejects most of it.
        target = rng.choice([prefill_buffers, decode_buffers])
        row = rng.choice(target)
        field = rng.choice([0, 3, 5, 6, 7])
        row[field] = rng.choice([row[field] + 1, max(1, row[field] - 1), row[field] * 3])
    return {
        "prefill": {"world_size": prefill_tp * prefill_dp, "dp_size": prefill_dp},
        "decode": {"world_size": decode_tp * decode_dp, "dp_size": decode_dp},
        "prefill_buffers": prefill_buffers,
        "decode_buffers": decode_buffers,
    }


def named_layouts() -> list[tuple[str, dict[str, Any]]]:
    """Hand-picked cases a runtime meets, named for failure messages."""

    def kv(tp: int, heads: int, layers: int = 2, bpu: int = 16 * 128 * 2) -> list[list[Any]]:
        replica = tp // heads if tp > heads else 1
        local = heads // (tp // replica)
        rows = []
        for layer in range(layers):
            for offset, kind in enumerate(("target_k", "target_v")):
                rows.append(
                    buffer_fields(
                        2 * layer + offset, kind, "kv_head", heads, bpu, local * bpu, replica
                    )
                )
        return rows

    def layout(
        ptp: int,
        dtp: int,
        heads: int,
        pdp: int = 1,
        ddp: int = 1,
        extra: list[tuple[list[Any], list[Any]]] | None = None,
    ) -> dict[str, Any]:
        prefill, decode = kv(ptp, heads), kv(dtp, heads)
        for p, d in extra or []:
            prefill.append(p)
            decode.append(d)
        return {
            "prefill": {"world_size": ptp * pdp, "dp_size": pdp},
            "decode": {"world_size": dtp * ddp, "dp_size": ddp},
            "prefill_buffers": prefill,
            "decode_buffers": decode,
        }

    mamba_p = buffer_fields(4, "mamba_state", "state_channel", 64, 128, 64 // 8 * 128, 1)
    mamba_d = buffer_fields(4, "mamba_state", "state_channel", 64, 128, 64 // 2 * 128, 1)
    mla = buffer_fields(4, "target_k", "replicated", 1, 576 * 2 * 16, 576 * 2 * 16, 1)
    return [
        ("tp8_to_tp2", layout(8, 2, 8)),
        ("tp2_to_tp8", layout(2, 8, 8)),
        ("tp4_to_tp4_identity", layout(4, 4, 8)),
        ("tp4_to_tp4_two_dp", layout(4, 4, 8, 2, 2)),
        ("gqa_tp4_2heads_to_tp1", layout(4, 1, 2)),
        ("gqa_tp16_8heads_to_tp4", layout(16, 4, 8)),
        ("gqa_tp8_2heads_to_tp8_2heads", layout(8, 8, 2)),
        ("mqa_tp8_to_tp2", layout(8, 2, 1)),
        ("mamba_tp8_to_tp2", layout(8, 2, 8, extra=[(mamba_p, mamba_d)])),
        ("mla_tp8_to_tp2", layout(8, 2, 8, extra=[(mla, mla)])),
        ("two_dp_each_side", layout(4, 2, 8, 2, 2)),
        ("prefill_more_dp_groups", layout(2, 2, 8, 4, 1)),
        ("decode_more_dp_groups_crashes", layout(2, 2, 8, 1, 2)),
        ("decode_more_dp_groups_fragmented_crashes", layout(4, 2, 8, 1, 2)),
        ("non_aligned_tp3_8heads", layout(3, 1, 8)),
        (
            "no_buffers",
            {
                "prefill": {"world_size": 2, "dp_size": 1},
                "decode": {"world_size": 2, "dp_size": 1},
                "prefill_buffers": [],
                "decode_buffers": [],
            },
        ),
    ]


def run_case(ref: Any, spec: dict[str, Any]) -> dict[str, Any]:
    def buffers(rows: list[list[Any]]) -> tuple[Any, ...]:
        return tuple(ref.BufferLayout(r[0], ref.BufferKind(r[1]), *r[2:]) for r in rows)

    try:
        planner = ref.PDTransferPlanner(
            prefill_layout=ref.ParallelLayout("prefill", **spec["prefill"]),
            decode_layout=ref.ParallelLayout("decode", **spec["decode"]),
            prefill_buffers=buffers(spec["prefill_buffers"]),
            decode_buffers=buffers(spec["decode_buffers"]),
        )
        plans = [planner.plan_for_decode_rank(rank) for rank in range(spec["decode"]["world_size"])]
    except ref.UnsupportedPDLayoutError as exc:
        return {"outcome": "rejected", "message": str(exc)}
    except Exception as exc:  # the reference crashes here; pdplan must reject instead
        return {"outcome": "crashed", "error": type(exc).__name__}

    def fragment(f: Any) -> dict[str, Any]:
        return {**f.__dict__, "buffer_kind": f.buffer_kind.value}

    encoded = []
    for plan in plans:
        for rank, fragments in plan.fragments_by_prefill_rank.items():
            version, payload = ref.encode_transfer_fragments(fragments)
            encoded.append(
                {
                    "dst_rank": fragments[0].dst_rank if fragments else None,
                    "prefill_rank": rank,
                    "version": version.decode("ascii"),
                    "payload": payload.decode("utf-8"),
                }
            )
    return {
        "outcome": "planned",
        "source_fanout": sorted(planner._required_dst_info_num_by_prefill_rank.items()),
        "plans": [
            {
                "plan_kind": p.plan_kind,
                "target_dp_group": p.target_dp_group,
                "target_prefill_ranks": list(p.target_prefill_ranks),
                "required_prefill_response_num": p.required_prefill_response_num,
                "fragments_by_prefill_rank": [
                    [rank, [fragment(f) for f in fs]]
                    for rank, fs in p.fragments_by_prefill_rank.items()
                ],
                "required_dst_info_num_by_prefill_rank": list(
                    p.required_dst_info_num_by_prefill_rank.items()
                ),
            }
            for p in plans
        ],
        "frames": encoded,
    }


def main() -> None:
    reference = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_REFERENCE
    ref = load_reference(reference)
    rng = random.Random(20261130)
    cases = [{"name": name, "layout": spec} for name, spec in named_layouts()]
    cases += [{"name": f"random_{i}", "layout": random_layout(rng)} for i in range(400)]
    for case in cases:
        case.update(run_case(ref, case["layout"]))
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(
        json.dumps(
            {"source": "shared/reference/transfer_plan.py", "cases": cases}, separators=(",", ":")
        )
        + "\n"
    )
    counts: dict[str, int] = {}
    for case in cases:
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
    print(f"wrote {len(cases)} cases to {OUTPUT.relative_to(ROOT)}: {counts}")


if __name__ == "__main__":
    main()
