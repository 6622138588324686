"""A model family through a KV connector on every TP pair its heads allow, with real vLLM
instances: three instances that each prefill and decode (``kv_both``), two of TP 1 and one of
TP 2, give 1 -> 1, 1 -> 2 and 2 -> 1; the first also decodes alone, without the connector
taking part (the reference). Shared by the real-engine tests (PdplanConnector) and the
side-by-side benchmark (PdplanConnector and NixlConnector, ``benches/vllm_families.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import landed
import numpy as np
from families import Family
from harness import MAX_TOKENS, Instance, decode_params, llm_args, pdplan_connector, prompts_of

#: Prompts of 20 to 250 tokens: within one block, across several, and (the longer ones)
#: leaving a 48-token window.
LENGTHS = (20, 45, 64, 97, 150, 200, 33, 130, 250)
#: The TP pairs every family runs (every KV-head count here divides 2).
PAIRS = ((1, 1), (1, 2), (2, 1))
#: What the connector logs when it hands blocks back to vLLM to recompute.
RECOMPUTED = "reported for vLLM to recompute"
#: The instances of a run: its name and TP size.
INSTANCES = (("tp1", 1), ("tp1b", 1), ("tp2", 2))
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


def connector_config(connector: str, port: int) -> dict[str, Any]:
    """``"pdplan"`` (through NIXL), ``"pdplan-mooncake"`` or ``"nixl"`` (NixlConnector)."""
    if connector.startswith("pdplan"):
        engine = connector.partition("-")[2] or "nixl"
        return pdplan_connector("kv_both", port, engine)
    return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu",
            "kv_load_failure_policy": "recompute"}  # fmt: skip


def prompts(salt: int = 0) -> list[list[int]]:
    return prompts_of(LENGTHS, salt=salt)


@dataclass
class Decoded:
    """One TP pair's decode: each prompt's tokens, vLLM's count of the batch's prompt tokens
    it took from the connector (external KV transfer) instead of computing them, what the
    prefill side sent, and the decode time (the decode side's generate)."""

    tokens: list[list[int]]
    loaded: int
    prefilled: list[dict[str, Any]]
    seconds: float
    #: With ``bytes=True`` (TP 1 -> 1): each request's blocks, per layer, as the prefill side
    #: held them before the read and as they landed on the decode side before any forward
    #: pass read them (``landed.block_bytes``: a list a block of the layer's tensors).
    held: list[dict[str, Any]] = field(default_factory=list)
    landed: list[dict[str, Any]] = field(default_factory=list)

    def differing_bytes(self) -> list[tuple[int, str, int]]:
        """(prompt, layer, block from the end) of every block whose bytes landed otherwise
        than the prefill side held them: blocks pair from the tail (a decode side may keep
        fewer of a window's)."""
        differing = []
        for prompt, (held, arrived) in enumerate(zip(self.held, self.landed)):
            # The model runner's groups also name layers reading another's cache (KV sharing),
            # the connector's do not: every layer that landed was held.
            assert arrived and set(arrived) <= set(held), (sorted(held), sorted(arrived))
            for layer, blocks in arrived.items():
                theirs = held[layer][len(held[layer]) - len(blocks) :]
                assert len(theirs) == len(blocks), (layer, len(held[layer]), len(blocks))
                for back, (mine, source) in enumerate(zip(blocks[::-1], theirs[::-1])):
                    if any(not np.array_equal(a, b) for a, b in zip(mine, source)):
                        differing.append((prompt, layer, back))
        return differing


@dataclass
class FamilyRun:
    """One family's three instances (by TP: ``"tp1"``, ``"tp1b"``, ``"tp2"``)."""

    family: Family
    model: Path
    connector: str
    logs: Path
    env: dict[str, str]
    #: Where the decode workers write the bytes that landed (``landed``).
    landed: Path
    instances: dict[str, Instance] = field(default_factory=dict)
    #: Instances without a connector whose steps take a given number of tokens.
    stepped: dict[int, Instance] = field(default_factory=dict)

    @property
    def reference(self) -> Instance:
        return self.instances["tp1"]

    def source_and_target(self, prefill_tp: int, decode_tp: int) -> tuple[Instance, Instance]:
        if (prefill_tp, decode_tp) == (1, 1):
            return self.instances["tp1"], self.instances["tp1b"]
        if (prefill_tp, decode_tp) == (1, 2):
            return self.instances["tp1"], self.instances["tp2"]
        return self.instances["tp2"], self.instances["tp1b"]

    def alone_in_steps(self, prompt: list[int], first_step: int) -> list[int]:
        """What one instance without a connector decodes when its first step computes
        ``first_step`` of the prompt's tokens (its step budget) and the next the rest; each
        budget's instance started once a run."""
        instance = self.stepped.get(first_step)
        if instance is None:
            args = _args(self.family, self.model, 1, None)
            args["max_num_batched_tokens"] = first_step
            log = self.logs / f"{self.family.name}-{self.connector}-steps-{first_step}.log"
            instance = self.stepped[first_step] = Instance(args, log, self.env)
        tokens: list[int] = instance.generate([prompt], [GREEDY])[0]["tokens"]
        return tokens

    def alone(self, batch: list[list[int]], instance: str = "tp1") -> list[list[int]]:
        """The reference: one instance (the TP 1 one) decodes the prompts itself."""
        outputs = self.instances[instance].generate(batch, [GREEDY] * len(batch))
        return [o["tokens"] for o in outputs]

    def prefill(self, source: Instance, batch: list[list[int]]) -> list[dict[str, Any]]:
        params = [
            {
                "max_tokens": 1,
                "temperature": 0.0,
                "extra_args": {"kv_transfer_params": {"do_remote_decode": True}},
            }
        ]
        return source.generate(batch, params * len(batch))  # fmt: skip

    def decode(
        self, target: Instance, batch: list[list[int]], prefilled: list[dict[str, Any]]
    ) -> Decoded:
        loaded = target.call("external_tokens")
        landed.read(str(self.landed))  # what earlier reads left
        started = time.perf_counter()
        outputs = target.generate(batch, decode_params(prefilled, MAX_TOKENS))
        seconds = time.perf_counter() - started
        loaded = target.call("external_tokens") - loaded
        decoded = Decoded([o["tokens"] for o in outputs], loaded, prefilled, seconds)
        workers = landed.read(str(self.landed))
        if len(workers) == 1:  # one decode worker: its requests in the order they were added
            ids = sorted(workers[0], key=lambda r: int(r.split("-")[0]))
            decoded.landed = [workers[0][r] for r in ids[-len(batch) :]]
        return decoded

    def pair(
        self, prefill_tp: int, decode_tp: int, batch: list[list[int]], with_bytes: bool = False
    ) -> Decoded:
        source, target = self.source_and_target(prefill_tp, decode_tp)
        prefilled = self.prefill(source, batch)
        held = []
        if with_bytes:  # the prefill side's blocks, read before the decode side frees them
            held = [source.call("block_bytes", p["kv_transfer_params"]["remote_block_ids"])[0]
                    for p in prefilled]  # fmt: skip
        decoded = self.decode(target, batch, prefilled)
        decoded.held = held
        return decoded


def _args(family: Family, model: Path, tp: int, connector: dict[str, Any] | None) -> dict[str, Any]:
    args = llm_args(model, tp=tp, connector=connector, block_size=family.block_size)
    args["dtype"] = family.dtype
    args["disable_log_stats"] = False  # vLLM counts the prompt tokens a connector loads
    if family.attention_backend is not None:
        args["attention_backend"] = family.attention_backend
    return args


@contextmanager
def family_run(
    family: Family, folder: Path, logs: Path, connector: str, port: int
) -> Iterator[FamilyRun]:
    """Writes the family's model and starts its three instances (closed on exit). Each
    instance's side channel: ``port``, ``port + 10``, ``port + 20`` (NixlConnector's through
    ``VLLM_NIXL_SIDE_CHANNEL_PORT``)."""
    model = family.write(folder / family.name, 0)
    # A bf16 instance can die of SIGILL in oneDNN unless AMX is set up first.
    env = {"PDPLAN_INIT_AMX": "1"} if family.dtype == "bfloat16" else {}
    env.update(family.env)
    folder_landed = logs / f"{family.name}-{connector}-landed"
    folder_landed.mkdir(exist_ok=True)
    env[landed.ENV] = str(folder_landed)
    run = FamilyRun(family, model, connector, logs, env, folder_landed)
    try:
        for number, (name, tp) in enumerate(INSTANCES):
            side = port + 10 * number
            run.instances[name] = Instance(
                _args(family, model, tp, connector_config(connector, side)),
                logs / f"{family.name}-{connector}-{name}.log",
                {**env, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
            )  # fmt: skip
        yield run
    finally:
        for instance in [*run.instances.values(), *run.stepped.values()]:
            instance.close()
