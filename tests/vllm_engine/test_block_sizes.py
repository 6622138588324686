"""Two instances whose blocks hold other token counts, through PdplanConnector, both ways: the
handshake states each side's blocks, and a request's tokens pair by their position, moved by
slot maps. Real vLLM 0.32 CPU instances:

- a Llama of sliding-window and full layers, 32-token blocks at TP 1 against 128-token blocks at
  TP 2 (a window's kept blocks pair by token across block sizes and TP sizes), the decode side
  with prefix caching on and a prefix hit of its own (only the tokens past it move);
- a Mamba2 hybrid (Nemotron-H), 32 against 128 at TP 1: its state slot pairs as before, its
  attention tokens by position;
- DeepSeek-V3's MLA latent on the CPU backend's 16-token kernel pages, the scheduler's blocks 16
  on one side and 64 (four kernel pages) on the other.

The oracle is vLLM: one instance decodes the prompts alone (tokens held equal; MLA to bytes, as
test_model_families says why), vLLM counts every prompt token the decode side did not hold as
loaded from the connector, and at TP 1 every token's bytes landed on the decode side as the
prefill side held them (each token's K and V read out of the CPU kernel's blocks, K transposed:
tests/test_cpu_block_sizes.py; each latent row; each state slot). NixlConnector on the same
pairs: benches/vllm_families.py. Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import landed
import numpy as np
import pytest
from families import FAMILIES, Family
from family_runs import GREEDY, _args, connector_config, prompts
from harness import MAX_TOKENS, Instance, decode_params, prefill_params, prompts_of

pytestmark = pytest.mark.vllm

#: What the connector logs when it hands blocks back to vLLM to recompute.
RECOMPUTED = "reported for vLLM to recompute"


@dataclasses.dataclass
class Side:
    instance: Instance
    block: int
    tp: int


@contextmanager
def two_sides(
    family: Family, folder: Path, logs: Path, sizes: tuple[tuple[int, int], tuple[int, int]],
    port: int, prefix_caching: bool = False, other: Family | None = None,
) -> Iterator[tuple[Side, Side, Path, Path]]:  # fmt: skip
    """Two ``kv_both`` instances of ``family`` (the second as ``other`` says, where given:
    another attention backend): ``(block, TP)`` each; the decode workers write what landed to
    the folder returned."""
    model = family.write(folder / family.name, 0)
    arrived = logs / f"{family.name}-blocks-landed"
    arrived.mkdir(exist_ok=True)
    env = {"PDPLAN_INIT_AMX": "1"} if family.dtype == "bfloat16" else {}
    env.update(family.env)
    env[landed.ENV] = str(arrived)
    sides: list[Side] = []
    try:
        for number, (block, tp) in enumerate(sizes):
            side_port = port + 10 * number
            kind = other if number and other is not None else family
            args = _args(dataclasses.replace(kind, block_size=block), model, tp,
                         connector_config("pdplan", side_port))  # fmt: skip
            args["enable_prefix_caching"] = prefix_caching
            instance = Instance(args, logs / f"{family.name}-blocks-{block}-tp{tp}.log", env)
            sides.append(Side(instance, block, tp))
        yield sides[0], sides[1], model, arrived
    finally:
        for side in sides:
            side.instance.close()


def token_bytes(blocks: list[list[np.ndarray]], block: int, token: int) -> list[bytes]:
    """A token's bytes of one layer, read out of the layer's blocks (``landed.block_bytes``): a
    state's slot whole; an MLA latent's row; vLLM's CPU attention block ``[heads, block, 2 *
    head_size]`` with K transposed, each head's K element by element then its V."""
    tensors = blocks[token // block]
    if len(tensors) > 1 or tensors[0].ndim != 3:
        if tensors[0].ndim == 2:  # an MLA latent: a row a token
            return [tensors[0][token % block].tobytes()]
        return [t.tobytes() for t in tensors]  # a state: the slot
    heads = tensors[0]
    at = token % block
    width = heads.shape[2] // 2  # K's bytes of a token: head_size elements of 4 bytes
    out = []
    for slab in heads.reshape(heads.shape[0], -1):
        elements = slab.reshape(-1, 4)
        k = elements[[d * block + at for d in range(width // 4)]]
        v = elements[block * (width // 4) + at * (width // 4) : block * (width // 4)
                     + (at + 1) * (width // 4)]  # fmt: skip
        out += [k.tobytes(), v.tobytes()]
    return out


def check_landed(
    held: list[dict[str, Any]], arrived: list[dict[str, Any]], batch: list[list[int]],
    blocks: tuple[dict[str, int], dict[str, int]], state: bool,
) -> int:  # fmt: skip
    """Every token of every layer landed as the prefill side held it (a state's slot once),
    each side's blocks of the tokens its group's spec says (``blocks``, by layer); returns the
    tokens compared."""
    compared = 0
    for prompt, mine, theirs in zip(batch, arrived, held):
        stop = len(prompt) - (1 if state else 0)
        assert set(mine) == set(theirs)
        for layer in mine:
            if len(mine[layer][0]) > 1:  # a state: its one slot
                assert token_bytes(mine[layer], 1, 0) == token_bytes(theirs[layer], 1, 0), layer
                continue
            # Each side's kept blocks are the tail over the tokens read.
            size, local_size = blocks[0][layer], blocks[1][layer]
            skipped = -(-stop // size) - len(theirs[layer])
            local_skipped = -(-stop // local_size) - len(mine[layer])
            for token in range(max(skipped * size, local_skipped * local_size), stop):
                want = token_bytes(theirs[layer], size, token - skipped * size)
                got = token_bytes(mine[layer], local_size, token - local_skipped * local_size)
                assert got == want, (len(prompt), layer, token)
                compared += 1
    return compared


@dataclasses.dataclass
class Read:
    """A batch prefilled on one side and decoded on the other: the tokens, vLLM's count of
    tokens loaded from the connector, and (at TP 1) what each request's blocks held on each
    side."""

    tokens: list[list[int]]
    loaded: int
    held: list[dict[str, Any]]
    landed: list[dict[str, Any]]


def read(prefill: Side, decode: Side, batch: list[list[int]], arrived: Path) -> Read:
    """Prefill then decode ``batch``."""
    prefilled = prefill.instance.generate(batch, prefill_params(len(batch)))
    held = []
    if prefill.tp == 1:
        held = [prefill.instance.call("block_bytes", p["kv_transfer_params"]["remote_block_ids"])[0]
                for p in prefilled]  # fmt: skip
    landed.read(str(arrived))
    before = decode.instance.call("external_tokens")
    outputs = decode.instance.generate(batch, decode_params(prefilled, MAX_TOKENS))
    loaded = decode.instance.call("external_tokens") - before
    assert RECOMPUTED not in decode.instance.tail(3000), decode.instance.tail()
    workers = landed.read(str(arrived))
    mine = []
    if decode.tp == 1 and len(workers) == 1:
        ids = sorted(workers[0], key=lambda r: int(r.split("-")[0]))
        mine = [workers[0][r] for r in ids[-len(batch) :]]
    return Read([o["tokens"] for o in outputs], loaded, held, mine)


def alone(side: Side, batch: list[list[int]]) -> list[list[int]]:
    return [o["tokens"] for o in side.instance.generate(batch, [GREEDY] * len(batch))]


def test_a_window_model_moves_between_blocks_of_32_and_128_and_tp_sizes(
    tmp_path: Path, logs: Path
) -> None:
    family = FAMILIES["llama-windowed"]
    with two_sides(family, tmp_path, logs, ((32, 1), (128, 2)), 9700, True) as sides:
        small, big, _, arrived = sides
        # Each batch's reference from the side that prefills it: the decode side must not have
        # computed it (with prefix caching it would hold it). fp32 decodes alike at TP 1 and 2.
        for prefill, decode, salt in ((small, big, 3), (big, small, 7)):
            batch = prompts(salt=salt)
            want = alone(prefill, batch)
            done = read(prefill, decode, batch, arrived)
            # A window leaves each prompt's last token to the decode side.
            assert done.loaded == sum(len(p) - 1 for p in batch), (prefill.block, done.loaded)
            assert done.tokens == want, (prefill.block, decode.block)
        # The decode side holds the head of the next prompts (whole 128-token blocks of a
        # prompt it ran itself, as far as vLLM finds them for every group: the window keeps
        # its last): only the rest is read, pairing by position with the prefill side's
        # 32-token blocks past them.
        shared = prompts_of((256,), salt=11)[0]
        alone(big, [shared])
        hits = [shared + tail for tail in prompts_of((40, 97, 150), salt=5)]
        want = alone(small, hits)
        done = read(small, big, hits, arrived)
        hit = sum(len(p) - 1 for p in hits) - done.loaded
        assert hit > 0 and hit % 128 == 0, (hit, done.loaded)
        assert done.tokens == want


def test_a_mamba2_hybrid_moves_between_blocks_of_32_and_128(tmp_path: Path, logs: Path) -> None:
    family = FAMILIES["nemotron-h"]
    with two_sides(family, tmp_path, logs, ((32, 1), (128, 1)), 9740) as sides:
        small, big, _, arrived = sides
        layers = (small.instance.call("layer_blocks"), big.instance.call("layer_blocks"))
        attention = [n for n in layers[0] if n.endswith("attn")]
        assert [layers[0][n] for n in attention] == [32] and [layers[1][n] for n in attention] == [
            128
        ], layers
        batch = prompts(salt=4)
        want = alone(small, batch)
        for (prefill, decode), blocks in (((small, big), layers), ((big, small), layers[::-1])):
            done = read(prefill, decode, batch, arrived)
            assert done.loaded == sum(len(p) - 1 for p in batch), (prefill.block, done.loaded)
            compared = check_landed(done.held, done.landed, batch, blocks, state=True)
            assert compared == sum(len(p) - 1 for p in batch), compared
            assert done.tokens == want, (prefill.block, done.tokens, want)


def test_an_mla_latent_moves_between_blocks_of_16_and_64(tmp_path: Path, logs: Path) -> None:
    """DeepSeek-V2 in bf16: CPU_MLA keeps 16-token blocks, AMX_MLA (this CPU's AMX tiles, which
    vLLM prefers) 64; both keep a token's latent as one row."""
    family = dataclasses.replace(FAMILIES["deepseek-v2"], attention_backend="CPU_MLA")
    amx = dataclasses.replace(family, attention_backend="AMX_MLA")
    with two_sides(family, tmp_path, logs, ((16, 1), (64, 1)), 9780, other=amx) as sides:
        small, big, _, arrived = sides
        layers = (small.instance.call("layer_blocks"), big.instance.call("layer_blocks"))
        assert set(layers[0].values()) == {16} and set(layers[1].values()) == {64}, layers
        batch = prompts(salt=6)
        for (prefill, decode), blocks in (((small, big), layers), ((big, small), layers[::-1])):
            done = read(prefill, decode, batch, arrived)
            assert done.loaded == sum(len(p) for p in batch), (prefill.block, done.loaded)
            compared = check_landed(done.held, done.landed, batch, blocks, state=False)
            assert compared == 2 * sum(len(p) for p in batch), compared  # two layers
