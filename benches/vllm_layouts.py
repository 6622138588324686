"""Pairs of instances whose blocks or parallel layouts differ, through PdplanConnector and
through vLLM's own NixlConnector side by side: 32-token blocks against 128 (a Llama of windows
and full layers, at TP 1 against TP 2, and Nemotron-H), the MLA latent's 16 against 64
(DeepSeek-V2, CPU_MLA against AMX_MLA), and two pipeline stages against TP ranks. For each
pair and connector: how many prompts decode what the prefill instance decodes alone, or
"refused" where the connector does not serve the pair (an instance that will not start, or
every prompt computed on the decode side: vLLM counts no token loaded). The tiny models and
instances of the real-engine tests (tests/vllm_engine). Needs vLLM (scripts/install_vllm.sh).

    python benches/vllm_layouts.py   # writes benches/results/vllm_layouts.md
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

from families import FAMILIES, Family  # noqa: E402
from family_runs import GREEDY, _args, connector_config, prompts  # noqa: E402
from harness import MAX_TOKENS, Instance, decode_params, prefill_params  # noqa: E402

from provenance import write  # noqa: E402

CONNECTORS = ("pdplan", "nixl")


@dataclasses.dataclass(frozen=True)
class Side:
    """One instance of a pair: its block, TP and PP sizes, and its attention backend."""

    block: int
    tp: int = 1
    pp: int = 1
    backend: str | None = None

    def __str__(self) -> str:
        parts = [f"{self.block}-token blocks", f"TP {self.tp}"]
        if self.pp > 1:
            parts.append(f"PP {self.pp}")
        if self.backend:
            parts.append(self.backend)
        return ", ".join(parts)


#: (what, family, prefill side, decode side).
CASES: list[tuple[str, str, Side, Side]] = [
    ("block sizes", "llama-windowed", Side(32), Side(128, tp=2)),
    ("block sizes", "llama-windowed", Side(128, tp=2), Side(32)),
    ("block sizes", "nemotron-h", Side(32), Side(128)),
    ("block sizes", "nemotron-h", Side(128), Side(32)),
    ("block sizes", "deepseek-v2", Side(16, backend="CPU_MLA"), Side(64, backend="AMX_MLA")),
    ("block sizes", "deepseek-v2", Side(64, backend="AMX_MLA"), Side(16, backend="CPU_MLA")),
    ("pipeline stages", "llama-windowed", Side(32, pp=2), Side(32, tp=2)),
    ("pipeline stages", "llama-windowed", Side(32, tp=2), Side(32, pp=2)),
    ("pipeline stages", "llama-windowed", Side(32, pp=2), Side(32)),
    ("pipeline stages", "llama-windowed", Side(32), Side(32, pp=2)),
]


def instance(family: Family, model: Path, side: Side, connector: str, port: int,
             log: Path) -> Instance:  # fmt: skip
    backend = side.backend or family.attention_backend
    kind = dataclasses.replace(family, block_size=side.block, attention_backend=backend)
    args = _args(kind, model, side.tp, connector_config(connector, port))
    if side.pp > 1:  # vLLM's CPU build runs stages with compilation on only
        args.update(pipeline_parallel_size=side.pp, enforce_eager=False)
    env = {"PDPLAN_INIT_AMX": "1"} if family.dtype == "bfloat16" else {}
    env.update(family.env)
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
    return Instance(args, log, env)


def served(family: Family, model: Path, case: tuple[Side, Side], connector: str, port: int,
           work: Path) -> str:  # fmt: skip
    """The pair's outcome through one connector."""
    instances: list[Instance] = []
    try:
        prefill = instance(family, model, case[0], connector, port, work / "prefill.log")
        instances.append(prefill)
        decode = instance(family, model, case[1], connector, port + 20, work / "decode.log")
        instances.append(decode)
    except Exception:
        traceback.print_exc()
        for started in instances:
            started.close()
        return "refused (at start)"
    try:
        batch = prompts()
        want = [o["tokens"] for o in prefill.generate(batch, [GREEDY] * len(batch))]
        prefilled = prefill.generate(batch, prefill_params(len(batch)))
        before = decode.call("external_tokens")
        outputs: Any = decode.generate(batch, decode_params(prefilled, MAX_TOKENS))
        if decode.call("external_tokens") == before:
            return "refused (computed locally)"
        equal = sum(o["tokens"] == w for o, w in zip(outputs, want))
        return f"{equal}/{len(batch)}"
    except Exception as error:
        traceback.print_exc()
        return f"failed ({type(error).__name__})"
    finally:
        for started in instances:
            started.close()


def main() -> None:
    work = Path("/tmp/pdplan-vllm-layouts")
    work.mkdir(exist_ok=True)
    rows = []
    for number, (what, name, prefill, decode) in enumerate(CASES):
        family = FAMILIES[name]
        model = family.write(work / name, 0)
        results = []
        for offset, connector in enumerate(CONNECTORS):
            port = 9000 + 100 * number + 50 * offset
            results.append(served(family, model, (prefill, decode), connector, port, work))
            print(what, name, prefill, decode, connector, results[-1], flush=True)
        rows.append(f"| {what} | {name} | {prefill} | {decode} | {results[0]} | {results[1]} |")
    table = "\n".join([
        f"Prompts of {len(prompts())} lengths (20 to 250 tokens) prefilled on one instance and "
        "decoded 12 tokens greedily on the other through each connector, against the prefill "
        "instance decoding them alone; tiny random-weight models (tests/vllm_engine/families.py),"
        " vLLM 0.32's CPU backend, both connectors through NIXL 1.5.1 (UCX, loopback). MLA on "
        "the CPU is no token oracle (one instance decodes a prompt otherwise batched than "
        "alone): tests/vllm_engine/test_block_sizes.py holds its latent rows to bytes.",
        "",
        "| what | family | prefill | decode | PdplanConnector equal | NixlConnector equal |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write("vllm_layouts.md", table)


if __name__ == "__main__":
    main()
