"""Every model family vLLM 0.32's CPU backend runs, through PdplanConnector on every TP pair
its heads allow (1 -> 1, 1 -> 2, 2 -> 1; through NIXL, and one family of each kind through
Mooncake): sliding windows mixed with full attention (Gemma-2, its head dim other than hidden
/ heads), every layer sliding (Mistral), MLA (DeepSeek-V3 in fp32, DeepSeek-V2 in bf16:
CPU_MLA here, AMX_MLA on a CPU with AMX), Mamba2 beside attention (Nemotron-H), Gated DeltaNet
beside attention (Qwen3-Next), short convs beside attention (LFM2), Mamba2 alone, and a
Llama of one KV head (kept whole on both TP 2 ranks). The oracle is vLLM itself: the TP 1
instance decodes the prompts alone. vLLM counts every prompt token as loaded (a model with
state: all but the last, which the decode side computes), nothing is recomputed, and a
control per family corrupts the prefill side's cache of the family's kind (the window
layers, the state, the latent) and must change every prompt's tokens.

A pair across TP sizes is held to the tokens one instance decodes alike at both sizes: all of
them in fp32; in bf16 (Qwen3-Next) the first few, as one instance at TP 2 drifts from one at
TP 1 on its own, and so at TP 1 -> 1 too (bf16 drifts with the batch a token is computed in).
A model with state is also held, at TP 1 -> 1, to one instance computing the prompt as the two
sides do (its first N - 1 tokens in one step, then the last) where that decodes otherwise than
one step (``as_the_two_sides_compute``). At TP 1 -> 1 every family is also held to bytes:
every block of every layer landed on the decode side as the prefill side held it, before any
forward pass read it (``landed``).

MLA is held to bytes, not tokens: vLLM 0.32's CPU MLA decodes one prompt differently batched
with others than alone (asserted here, so that a vLLM that stops doing so turns the check to
tokens), so one instance is no oracle for it. Every latent row the prefill side holds for a
request's tokens must be in the decode side's cache, on every decode rank.

Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
from families import FAMILIES
from family_runs import PAIRS, RECOMPUTED, Decoded, FamilyRun, family_run, prompts
from registry_families import REGISTRY

pytestmark = pytest.mark.vllm

#: The families CI runs, each with its transfer engine: one family of each kind (windows,
#: MLA, state) moves through Mooncake (``families.FAMILIES`` holds a few more the benchmark
#: runs too).
CI_FAMILIES = {
    "gemma2": "nixl", "mistral": "mooncake", "deepseek-v3": "nixl", "deepseek-v2": "mooncake",
    "nemotron-h": "nixl", "qwen3-next": "nixl", "lfm2": "mooncake", "mamba2": "nixl",
    "one-kv-head": "nixl", "falcon-h1": "nixl", "granite-hybrid": "nixl",
    # From the registry's walk, each a path of the connector's own: chunked local attention
    # (the last token left to the decode side) and layers sharing another's KV. The walk's
    # other families (sinks, MoE, the Transformers backend, ...) keep caches of kinds above:
    # benches/vllm_families.py runs every one beside NixlConnector.
    "llama4": "nixl", "gemma3n": "nixl", "zamba2": "nixl",
}  # fmt: skip
#: Every family: the ones above and the rest of the registry's walk (the benchmark runs all).
EVERY = {**FAMILIES, **REGISTRY}
#: vLLM's spec classes of each kind of cache, for the control.
SPECS = {
    "window": ["SlidingWindowSpec", "ChunkedLocalAttentionSpec"],
    "state": ["MambaSpec"],
    "mla": ["MLAAttentionSpec"],
    "attention": ["FullAttentionSpec"],
}


def check_latent(run: FamilyRun, pair: tuple[int, int], decoded: Decoded,
                 batch: list[list[int]]) -> None:  # fmt: skip
    source, target = run.source_and_target(*pair)
    held = target.call("all_token_rows")
    for prompt, prefilled in zip(batch, decoded.prefilled):
        blocks = prefilled["kv_transfer_params"]["remote_block_ids"][0]
        rows = source.call("token_rows", {"blocks": blocks, "tokens": len(prompt) - 1})
        for worker in rows:  # every prefill rank holds the whole latent
            for rank in held:
                for layer, (want, have) in enumerate(zip(worker, rank)):
                    missing = [t for t, row in enumerate(want) if row not in have]
                    assert not missing, (len(prompt), layer, missing[:8])


def agreed(one: list[int], other: list[int]) -> int:
    """How many first tokens two decodes share."""
    return next((i for i, (a, b) in enumerate(zip(one, other)) if a != b), len(one))


def as_the_two_sides_compute(
    run: FamilyRun, batch: list[list[int]], want: list[list[int]], got: list[list[int]]
) -> list[list[int]]:
    """The reference for a model with state: what one instance decodes alone (``want``, as far
    as it is held), or, for a prompt the pair decodes otherwise, what one instance decodes
    computing it as the two sides do: its first N - 1 tokens in one step (the prefill side),
    then the last (the decode side). vLLM's bf16 Gated DeltaNet on this CPU decodes some
    prompts so otherwise than in one step (a 33-token prompt here, as a 32 + 1 chunked prefill
    in one instance shows); a state read wrong would match neither."""
    out = []
    for prompt, tokens, decoded in zip(batch, want, got):
        if decoded != tokens:
            tokens = run.alone_in_steps(prompt, len(prompt) - 1)[: len(tokens)]
        out.append(tokens)
    return out


def copied_groups_control(
    run: FamilyRun, pair: tuple[int, int], batch: list[list[int]], good: list[list[int]]
) -> None:
    """The control of a pair whose ranks hold copies of Mamba2's B and C (n_groups below TP):
    the same prompts again with only those channels of the prefill side's conv states made
    noise on every rank; the decode side must decode otherwise, so a copy read wrong (or not
    written on a decode rank) would show."""
    source, target = run.source_and_target(*pair)
    prefilled = run.prefill(source, batch)
    source.call("corrupt", {"specs": SPECS["state"], "conv_tail": run.family.copied_channels})
    decoded = run.decode(target, batch, prefilled)
    differing = [got != ref for got, ref in zip(decoded.tokens, good)]
    # Noise in a few conv channels of the last tokens reaches the state through one gate: a
    # prompt of a random-weight model may still decode its 12 tokens alike (one of 9 did in CI).
    # A copy never read would leave every prompt alike.
    assert 3 * sum(differing) >= 2 * len(differing), (pair, differing)


@pytest.mark.parametrize("name", list(CI_FAMILIES))
def test_a_family_decodes_through_the_connector_what_one_instance_decodes(
    name: str, tmp_path: Path, logs: Path
) -> None:
    family = EVERY[name]
    port = 8000 + 100 * list(CI_FAMILIES).index(name)
    connector = "pdplan" if CI_FAMILIES[name] == "nixl" else "pdplan-mooncake"
    with family_run(family, tmp_path, logs, connector, port) as run:
        batch = prompts()
        want = run.alone(batch)
        assert len({tokens[0] for tokens in want}) > 1, "the model decodes the same everywhere"
        mla = "mla" in family.kinds
        if mla:
            # Why MLA is held to bytes: vLLM decodes a prompt alone otherwise than batched.
            alone = [run.alone([prompt])[0] for prompt in batch]
            assert alone != want, "vLLM's CPU MLA now decodes alone as batched: compare tokens"
        # The tokens one instance decodes at TP 1 and at TP 2 alike: all of them in fp32; in
        # bf16 (Qwen3-Next's GDN) the first few, the rest drifting with the TP size alone. A
        # pair across TP sizes is held to those.
        across = [agreed(one, two) for one, two in zip(want, run.alone(batch, "tp2"))]
        assert mla or min(across) >= 1, ("TP 1 and TP 2 decode other first tokens", across)
        for pair in PAIRS:
            decoded = run.pair(*pair, batch, with_bytes=pair == (1, 1))
            target = run.source_and_target(*pair)[1]
            assert RECOMPUTED not in target.tail(3000), (pair, target.tail())
            if pair == (1, 1):
                # Every block of every layer landed as the prefill side held it, before any
                # forward pass read it: where tokens differ, the bytes do not.
                assert len(decoded.landed) == len(batch), "the decode worker saw no reads land"
                assert not decoded.differing_bytes(), decoded.differing_bytes()[:8]
            # vLLM took every prompt token from the connector; with state, all but the last,
            # which the prefill side leaves to the decode side (the state stands before it).
            backoff = 1 if {"state", "window"} & set(family.kinds) else 0
            assert decoded.loaded == sum(len(p) - backoff for p in batch), (pair, decoded.loaded)
            if mla:
                check_latent(run, pair, decoded, batch)
                continue
            # fp32 decodes alike whatever the batch; bf16 (Qwen3-Next) drifts with it past the
            # first few tokens, even at TP 1 -> 1, where every byte landed as held (above).
            exact = pair == (1, 1) and family.dtype == "float32"
            held = [len(t) for t in want] if exact else across
            got = [t[:n] for t, n in zip(decoded.tokens, held)]
            expected = [t[:n] for t, n in zip(want, held)]
            if backoff:
                expected = as_the_two_sides_compute(run, batch, expected, got)
            assert got == expected, (pair, got, expected)
            if family.copied_channels:
                copied_groups_control(run, pair, batch, decoded.tokens)
        # The control: the prefill side's cache of the family's kind made noise after its
        # forward pass; the decode side decodes that noise.
        kind = family.kinds[0]
        source, target = run.source_and_target(1, 1)
        prefilled = run.prefill(source, batch)
        source.call("corrupt", SPECS[kind])
        decoded = run.decode(target, batch, prefilled)
        if mla:
            check_latent(run, (1, 1), decoded, batch)  # the noise itself was read
        else:
            differing = [got != ref for got, ref in zip(decoded.tokens, want)]
            assert all(differing), (kind, differing)
