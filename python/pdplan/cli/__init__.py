"""The ``pdplan`` command: who talks to whom, how many bytes, how many descriptors.

    pdplan demo
    pdplan plan --prefill-tp 8 --decode-tp 2 --model llama-3-70b \
        [--format table|json|routing-json|dot] [--decode-rank N ...]
    pdplan check --prefill-tp 8 --decode-tp 3 --model llama-3-70b \
        [--unavailable-prefill-rank N ...]
    pdplan check --prefill-tp 8 --decode-tp 2 --config path/to/model/   # or .../config.json
    pdplan cost --prefill-tp 8 --decode-tp 2 --model llama-3-70b --tokens 32768 \
        [--decode-prefix N] [--format table|json]

User errors print one line and exit 2 (a flag argparse refuses: its line and a hint); there is
no traceback for them. A config is named in messages by the path given.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pdplan._model import UnsupportedPDLayoutError
from pdplan.cli.arguments import UserError, cost_model, parse
from pdplan.cli.cost import print_cost
from pdplan.cli.demo import demo
from pdplan.cli.deployment import Deployment, model_name, planner_from_args, shape_of
from pdplan.cli.failover import failover_lines
from pdplan.cli.formats import (
    chosen_ranks,
    context_line,
    idle_note,
    model_lines,
    print_dot,
    print_families,
    print_table,
    request_lines,
    write_plan_json,
    write_routing_json,
)
from pdplan.cli.suggestions import suggestion

EXIT_UNSUPPORTED = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.command == "demo":
            demo()
            return 0
        if args.command == "models":
            print_families(args.format)
            return 0
        if args.command == "cost":
            print_cost(args, shape_of(args), cost_model(args))
            return 0
        if args.command == "check":
            shape = shape_of(args)  # a model that cannot be read is a user error, not a layout's
            try:
                planner = Deployment.from_args(args).planner(shape)
                planner.verify()
            except UnsupportedPDLayoutError as exc:
                print(f"unsupported: {exc}{suggestion(args, shape)}", file=sys.stderr)
                return EXIT_UNSUPPORTED
            for line in model_lines(shape, model_name(args)):
                print(line)
            kind = planner.plan_for_decode_rank(0).plan_kind
            print(f"supported: {kind} plan, {len(planner.prefill_buffers)} buffers, verified")
            if line := context_line(planner):
                print(line)
            for line in request_lines(planner, cost_model(args), args.chunk_bytes):
                print(line)
            if note := idle_note(planner):
                print(f"note: {note}")
            if args.unavailable_prefill_rank:
                failover = planner.without_prefill_ranks(args.unavailable_prefill_rank)
                failover.verify()
                lines, lost = failover_lines(planner, failover)
                print("\n".join(lines))
                return EXIT_UNSUPPORTED if lost else 0
            return 0
        shape, planner = planner_from_args(args)
        ranks = chosen_ranks(args, planner)
        if args.format == "json":
            write_plan_json(sys.stdout, shape, planner, ranks)
        elif args.format == "routing-json":
            write_routing_json(sys.stdout, shape, planner, ranks)
        elif args.format == "dot":
            print_dot(planner, ranks)
        else:
            print_table(
                shape,
                planner,
                cost_model(args),
                args.chunk_bytes,
                ranks if args.decode_rank else None,
                model_name(args),
            )
        return 0
    except (UserError, UnsupportedPDLayoutError) as exc:
        print(f"pdplan: {exc}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except BrokenPipeError:  # `pdplan plan ... | head`
        return 0


__all__ = ["main"]
