"""The command's arguments: every flag, each parsed and judged as it is read; a user error
is one line and exit 2 (``UserError``), and so is a flag argparse refuses (its line, then where
the options are listed: never the whole usage)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import NoReturn

from pdplan._bounded import shown
from pdplan._core import __version__
from pdplan._layouts import (
    MODEL_PRESETS,
)
from pdplan._staging import CostModel


class UserError(Exception):
    """A problem with what the user asked for: one line, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusals are argparse's error line and a hint (exit 2, as
    argparse's): the usage of ``plan`` or ``check`` runs to 22 lines, which bury the line that
    says what is wrong."""

    #: What ``PROG --help`` lists, for the hint.
    lists = "the options"
    #: The subcommands' parsers, by name (the top parser's only).
    commands: dict[str, Parser]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists {self.lists})\n")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, parsed; refusals as ``Parser.error`` words them, by the subcommand's
    parser when a subcommand was given (so its hint points at its own ``--help``)."""
    top = parser()
    args, unknown = top.parse_known_args(argv)
    if unknown:
        command = top.commands.get(getattr(args, "command", None) or "", top)
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {shown(text)}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count of at least 0, got {shown(text)}")
    return value


def _real(text: str, positive: bool) -> float:
    """A finite number of at least 0 (above 0 when `positive`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {shown(text)}") from None
    if not 0 <= value < float("inf") or (positive and value == 0):
        what = "positive" if positive else "non-negative"
        raise argparse.ArgumentTypeError(f"expected a finite, {what} number, got {shown(text)}")
    return value


def _non_negative(text: str) -> float:
    return _real(text, positive=False)


def _positive_real(text: str) -> float:
    return _real(text, positive=True)


def cost_model(args: argparse.Namespace) -> CostModel:
    return CostModel(
        per_descriptor_s=args.per_descriptor_us * 1e-6,
        network_bytes_per_s=args.network_gbit * 1e9 / 8,
        copy_bytes_per_s=args.copy_gbyte * 1e9,
        per_copy_s=args.per_copy_us * 1e-6,
        per_segment_s=args.per_segment_ns * 1e-9,
        per_row_s=args.per_row_us * 1e-6,
        per_block_s=args.per_block_us * 1e-6,
    )


def _rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank number, got {shown(text)}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a rank >= 0, got {value}")
    return value


def _partition(text: str) -> tuple[int, ...]:
    """Layer counts as written; whether they make a partition is the core's to say."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected layer counts separated by commas, got {shown(text)}"
        ) from None


def _layout_options(parser: argparse.ArgumentParser) -> None:
    sides = parser.add_argument_group("parallel layouts")
    sides.add_argument("--prefill-tp", type=_positive, required=True, help="TP size per DP group")
    sides.add_argument("--prefill-dp", type=_positive, default=1, help="DP groups (default 1)")
    sides.add_argument("--decode-tp", type=_positive, required=True, help="TP size per DP group")
    sides.add_argument("--decode-dp", type=_positive, default=1, help="DP groups (default 1)")
    sides.add_argument("--prefill-pp", type=_positive, default=1, help="pipeline stages (1)")
    sides.add_argument("--decode-pp", type=_positive, default=1, help="pipeline stages (1)")
    sides.add_argument(
        "--prefill-pp-partition",
        type=_partition,
        metavar="N,N,...",
        help="layers of each prefill stage (default: as even as possible, first stages more)",
    )
    sides.add_argument(
        "--decode-pp-partition", type=_partition, metavar="N,N,...", help="layers a decode stage"
    )
    context = parser.add_argument_group(
        "context parallelism (tokens spread over ranks; one kind a side)"
    )
    for side in ("prefill", "decode"):
        context.add_argument(
            f"--{side}-cp",
            type=_positive,
            default=1,
            help=f"{side} CP ranks of their own, beside TP (default 1)",
        )
        context.add_argument(
            f"--{side}-dcp",
            type=_positive,
            default=1,
            help=f"{side} DCP ranks carved out of TP: TP rank r holds share r %% dcp (default 1)",
        )
    context.add_argument(
        "--interleave",
        type=_positive,
        default=1,
        help="tokens a block when dealing round-robin (vLLM's cp_kv_cache_interleave_size, "
        "default 1; the page size is block round-robin)",
    )
    context.add_argument(
        "--cp-split",
        choices=("interleave", "contiguous", "zigzag"),
        default="interleave",
        help="how CP ranks of their own deal the prompt (default interleave); DCP always "
        "interleaves",
    )
    context.add_argument(
        "--cp-kv",
        choices=("sharded", "replicated"),
        default="sharded",
        help="CP ranks hold disjoint shares (default) or every token (replicas to read from)",
    )
    model = parser.add_argument_group("model (one of --model, --config or the shape options)")
    model.add_argument(
        "--model",
        type=_model,
        metavar="NAME|PATH",
        help=f"a preset ({', '.join(MODEL_PRESETS)}), or the path of a local config (as --config)",
    )
    model.add_argument(
        "--config",
        metavar="PATH",
        help="a local Hugging Face config file, or a model's folder holding its config.json",
    )
    model.add_argument(
        "--family",
        metavar="NAME",
        help="read the config with this family's reader whatever its architecture says "
        "(`pdplan models` lists them)",
    )
    model.add_argument("--layers", type=_positive)
    model.add_argument("--kv-heads", type=_positive)
    model.add_argument("--head-dim", type=_positive)
    model.add_argument(
        "--dtype",
        help="the model's dtype: bfloat16 (default with the shape options), float16, float32; "
        "with --model or --config it replaces the config's",
    )
    model.add_argument(
        "--page-size",
        type=_positive,
        help="tokens a page (16, or what the runtime fixes for the model: DeepSeek-V4 256)",
    )
    model.add_argument(
        "--kv-cache-dtype",
        help="the KV cache's element type (default: the model's): fp8, float8_e5m2, nvfp4, ...",
    )
    model.add_argument(
        "--state-dtype",
        help="SSM and recurrent states' element type (default: the model's; vLLM's "
        "mamba_ssm_cache_dtype is often float32)",
    )
    model.add_argument(
        "--prefill-page-size",
        type=_positive,
        help="tokens a prefill page (default: --page-size); sides whose page sizes differ move "
        "by slot maps (token_maps)",
    )
    model.add_argument(
        "--decode-page-size", type=_positive, help="tokens a decode page (default: --page-size)"
    )
    cost = parser.add_argument_group(
        "staging cost model (defaults: GPU caches behind a 400 Gb/s NIC; see pdplan.CostModel)"
    )
    defaults = CostModel()
    figures = (
        ("--per-descriptor-us", _non_negative, defaults.per_descriptor_s * 1e6,
         "what the engine pays a descriptor, in µs"),
        ("--network-gbit", _positive_real, defaults.network_bytes_per_s * 8 / 1e9,
         "wire bandwidth, in Gb/s"),
        ("--copy-gbyte", _positive_real, defaults.copy_bytes_per_s / 1e9,
         "gather/scatter copy rate, in GB/s"),
        ("--per-copy-us", _non_negative, defaults.per_copy_s * 1e6,
         "fixed cost of one gather or scatter (a kernel launch), in µs"),
        ("--per-segment-ns", _non_negative, defaults.per_segment_s * 1e9,
         "cost of each gather/scatter segment, in ns"),
        ("--per-row-us", _non_negative, defaults.per_row_s * 1e6,
         "what the engine pays a strided list's row (NIXL 1.5), in µs"),
        ("--per-block-us", _non_negative, defaults.per_block_s * 1e6,
         "what the engine pays each block of a strided row, in µs"),
    )  # fmt: skip
    for flag, kind, default, text in figures:
        cost.add_argument(flag, type=kind, default=default, help=f"{text} (%(default)g)")
    cost.add_argument(
        "--chunk-bytes",
        type=_positive,
        default=None,
        help="split the staged transfer into chunks of this many bytes (default: one)",
    )
    pages = parser.add_argument_group("pages and receivers")
    pages.add_argument(
        "--kv-layout",
        choices=("HND", "NHD"),
        default="HND",
        help="KV page layout: HND head-major (default) or NHD token-major (a row per token)",
    )
    pages.add_argument(
        "--decode-replicas",
        choices=("first", "all"),
        default="first",
        help="which decode ranks of a replica group receive: first (default, as the "
        "reference) or all, directly",
    )


def parser() -> Parser:
    parser = Parser(
        prog="pdplan",
        description="Plan prefill -> decode KV-cache transfers between two parallel layouts.",
    )
    parser.add_argument("--version", action="version", version=f"pdplan {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "demo",
        help="a Llama-3-70B-like model, prefill TP 8 -> decode TP 2, end to end",
        description="Plan a Llama-3-70B-like model from prefill TP 8 to decode TP 2: routing, "
        "fanout, bytes per rank per page, and the descriptors of a 32k-token request.",
    )
    plan = commands.add_parser(
        "plan",
        help="print the plan of every decode rank",
        description="Print every decode rank's plan, the fanout and the routing.",
    )
    _layout_options(plan)
    plan.add_argument(
        "--format",
        choices=("table", "json", "routing-json", "dot"),
        default="table",
        help="table (default); json: every fragment of every shown rank; routing-json: pairs, "
        "fragment counts, bytes per page and fanout only; dot: a Graphviz graph",
    )
    plan.add_argument(
        "--decode-rank",
        type=_rank,
        action="append",
        metavar="N",
        help="show only this decode rank (repeatable; default: every decode rank)",
    )
    check = commands.add_parser(
        "check",
        help="exit 0 when the layouts are supported, 2 with the reason when not",
        description="Exit 0 when supported; otherwise print why and what would work, exit 2.",
    )
    _layout_options(check)
    check.add_argument(
        "--unavailable-prefill-rank",
        type=_rank,
        action="append",
        metavar="N",
        help="plan around this prefill rank, gone (repeatable): report who still serves each "
        "decode rank and what is lost; exit 2 when anything is",
    )
    cost = commands.add_parser(
        "cost",
        help="what one request costs the pairing: bytes and descriptors per rank pair, fanout, "
        "time",
        description="One request of --tokens tokens, the decode side holding the first "
        "--decode-prefix: every rank pair's descriptors and bytes, the largest fanout and the "
        "cost model's time (pdplan.Pairing), its pages scattered on both sides.",
    )
    _layout_options(cost)
    cost.add_argument("--tokens", type=_positive, required=True, help="the request's length")
    cost.add_argument(
        "--decode-prefix",
        type=_count,
        default=0,
        metavar="N",
        help="tokens the decode side already holds (its prefix cache hit; default 0)",
    )
    cost.add_argument("--format", choices=("table", "json"), default="table")
    models = commands.add_parser(
        "models",
        help="list the model families whose configs pdplan reads",
        description="Every model family: the architectures and model types its reader covers, "
        "the cache-shaping config keys it reads, and the modeling code its rule follows.",
    )
    models.add_argument("--format", choices=("table", "json"), default="table")
    parser.commands = commands.choices
    parser.lists = f"the commands: {', '.join(parser.commands)}"
    return parser


def _model(value: str) -> str:
    """A preset name or a path: anything that exists, ends in ``.json`` or names a folder
    (``dir/``) is read later, where a missing or unreadable file is reported by its path."""
    separators = {os.sep, os.altsep or os.sep}
    if (
        value in MODEL_PRESETS
        or value.endswith(".json")
        or any(s in value for s in separators)
        or os.path.exists(value)
    ):
        return value
    raise argparse.ArgumentTypeError(
        f"unknown model {shown(value)}: give a preset ({', '.join(MODEL_PRESETS)}), a config "
        "file or a model's folder"
    )
