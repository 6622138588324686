"""Every model family vLLM 0.32's CPU backend runs, through PdplanConnector and through vLLM's
own NixlConnector, side by side on every TP pair (1 -> 1, 1 -> 2, 2 -> 1): the tiny models and
instances of the real-engine tests (tests/vllm_engine/families.py, registry_families.py,
family_runs.py), the same
prompts, one connector's instances up at a time. For each (family, pair, connector): how many
of the prompts decode what one instance decodes alone, "refused" where the connector does not
serve the pair (an instance that will not start, or every prompt computed on the decode side:
vLLM counts no token it did not compute), and the decode side's time for the batch where both
connectors decode every prompt equal. Needs vLLM (scripts/install_vllm.sh).

    python benches/vllm_families.py   # writes benches/results/vllm_families.md
    PDPLAN_FAMILIES=gemma2,mamba2 python benches/vllm_families.py   # some of them
    PDPLAN_CONNECTORS=pdplan PDPLAN_RESULTS=vllm_families_more.md python benches/vllm_families.py
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

from families import FAMILIES as NAMED  # noqa: E402
from family_runs import PAIRS, FamilyRun, family_run, prompts  # noqa: E402
from registry_families import REGISTRY  # noqa: E402

from provenance import write  # noqa: E402

CONNECTORS = ("pdplan", "nixl")
#: A family vLLM's CPU build does not run at TP 2 on its own (one instance alone fails).
FAILS_AT_TP2 = "vLLM alone fails at TP 2"
#: The families of the real-engine tests, then the rest of vLLM's registry its CPU build runs.
FAMILIES = {**NAMED, **REGISTRY}


def served(run: FamilyRun, want: list[list[int]]) -> dict[tuple[int, int], tuple[str, float]]:
    """Each pair's outcome: ``"9/9"``-like counts of prompts equal, or ``"refused"``; and the
    decode time (s). Under ``(2, 2)``: how many the TP 2 instance decodes alone as the TP 1 one
    does (the floor of a pair across TP sizes)."""
    batch = prompts()
    try:
        alone = run.alone(batch, "tp2")
    except Exception:  # vLLM's own worker dies at TP 2 (no request crossed a connector)
        traceback.print_exc()
        alone = None
    floor = f"{sum(a == b for a, b in zip(alone, want))}/{len(want)}" if alone else FAILS_AT_TP2
    out = {(2, 2): (floor, 0.0)}
    for pair in PAIRS:
        if alone is None and 2 in pair:
            out[pair] = (FAILS_AT_TP2, 0.0)
            continue
        try:
            decoded = run.pair(*pair, batch)
        except Exception as error:  # a pair the connector cannot run at all
            out[pair] = (f"refused ({type(error).__name__})", 0.0)
            continue
        if not decoded.loaded:
            out[pair] = ("refused (computed locally)", decoded.seconds)
            continue
        equal = sum(got == ref for got, ref in zip(decoded.tokens, want))
        out[pair] = (f"{equal}/{len(want)}", decoded.seconds)
    return out


def main() -> None:
    work = Path("/tmp/pdplan-vllm-families")
    work.mkdir(exist_ok=True)
    names = [n for n in os.environ.get("PDPLAN_FAMILIES", "").split(",") if n] or list(FAMILIES)
    connectors = [c for c in os.environ.get("PDPLAN_CONNECTORS", "").split(",") if c]
    connectors = connectors or list(CONNECTORS)
    out = os.environ.get("PDPLAN_RESULTS", "vllm_families.md")
    results: dict[tuple[str, str], dict[tuple[int, int], tuple[str, float]]] = {}
    for number, name in enumerate(names):
        family = FAMILIES[name]
        for offset, connector in enumerate(connectors):
            port = 9000 + 100 * number + 40 * offset
            try:
                with family_run(family, work, work, connector, port) as run:
                    want = run.alone(prompts())
                    results[name, connector] = served(run, want)
            except Exception:  # instances that do not start: the connector refuses the model
                traceback.print_exc()
                results[name, connector] = {p: ("refused (at start)", 0.0) for p in PAIRS}
                results[name, connector][2, 2] = ("—", 0.0)
            print(name, connector, results[name, connector], flush=True)
        # Written after each family: a run cut short keeps the families it finished.
        done = [n for n in names if all((n, c) in results for c in connectors)]
        write_table(done, results, out)


def write_table(
    names: list[str],
    results: dict[tuple[str, str], dict[tuple[int, int], tuple[str, float]]],
    out: str,
) -> None:
    """The table of ``names``' results, one row a (family, pair), into ``out``; a connector
    left out of the run shows "not run"."""
    absent = {p: ("not run", 0.0) for p in (*PAIRS, (2, 2))}
    rows = []
    for name in names:
        mine, nixl = results.get((name, "pdplan"), absent), results.get((name, "nixl"), absent)
        floor = mine[2, 2][0]
        if floor in ("—", "not run"):
            floor = nixl[2, 2][0]
        for pair in PAIRS:
            ours, theirs = mine[pair], nixl[pair]
            both = ours[0] == theirs[0] == f"{len(prompts())}/{len(prompts())}"
            times = [f"{ours[1] * 1e3:.0f}", f"{theirs[1] * 1e3:.0f}"] if both else ["—", "—"]
            alone = "—" if pair == (1, 1) else floor
            rows.append(f"| {name} | {pair[0]} -> {pair[1]} | {ours[0]} | {theirs[0]} | "
                        f"{alone} | {' | '.join(times)} |")  # fmt: skip
    table = "\n".join([
        f"Prompts of {len(prompts())} lengths (20 to 250 tokens) decoded 12 tokens greedily "
        "through each connector on each TP pair, against the TP 1 instance decoding them "
        "alone; tiny random-weight models (tests/vllm_engine/families.py, registry_families.py), "
        "vLLM 0.32's CPU backend, both connectors through NIXL 1.5.1 (UCX, loopback), every "
        "instance kv_both. TP 2 alone: how many the TP 2 instance decodes alone as the TP 1 one "
        "does, the most a pair across TP sizes can be held to (bf16 drifts). Decode time: the "
        "decode side's generate for the batch (the pull and 12 steps), where both decode "
        "every prompt equal.",
        "",
        "| family | prefill TP -> decode TP | PdplanConnector equal | NixlConnector equal | "
        "TP 2 alone equal | decode, PdplanConnector (ms) | decode, NixlConnector (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write(out, table)


if __name__ == "__main__":
    main()
