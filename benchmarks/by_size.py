"""The same variant of several studies side by side by model size: ``by_size.md`` (one table per
task, each under a claims anchor the docs test checks against the study.json files) and
``by_size.png`` (the Hydra's edge over its naive pruned twin against the parameter count), both
written atomically (:mod:`flows.study.report.by_size` builds them)::

    python -m benchmarks.by_size \\
        --task "BBC News" MiniLM-L6=docs/studies/text-evidence/study.json:taylor-half \\
            MPNet-base=docs/studies/<mpnet-bbc-news>/study.json:mp-taylor-half \\
        --task brown-genres MiniLM-L6=docs/studies/brown-genres/study.json:bg-default \\
            MPNet-base=docs/studies/<mpnet-brown-genres>/study.json:mpbg-taylor-half \\
        --out docs/studies/by-size

Each ``--task NAME MODEL=STUDY_JSON:VARIANT ...`` is one table. A study is named by its folder
(the claims anchor names ``docs/studies/<study>/study.json``). The single model's parameter count
is read from each study.json; ``--params MODEL=COUNT`` gives it where a study.json has none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.study.report.by_size import Entry, by_size_figure, by_size_markdown, entry
from hydra_ops.atomic import atomic_write_bytes

MARKDOWN, FIGURE = "by_size.md", "by_size.png"


def parse_entry(text: str, params: dict[str, float]) -> Entry:
    """``MODEL=PATH:VARIANT`` -> its checked :class:`Entry`; one-line :class:`ValueError`."""
    model, eq, rest = text.partition("=")
    path, colon, variant = rest.rpartition(":")
    if not (eq and colon and model and path and variant):
        raise ValueError(f"expected MODEL=STUDY_JSON:VARIANT, got {text!r}")
    try:
        report = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e.msg} (line {e.lineno})") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path} is not a study.json (not an object)")
    return entry(model, report, Path(path).parent.name, variant, params.get(model))


def parse_params(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        model, eq, count = item.partition("=")
        try:
            out[model] = float(count.replace(",", "").replace("_", ""))
        except ValueError:
            raise ValueError(f"--params expects MODEL=COUNT, got {item!r}") from None
        if not eq or not model:
            raise ValueError(f"--params expects MODEL=COUNT, got {item!r}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.by_size", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--task",
        nargs="+",
        action="append",
        required=True,
        metavar="NAME MODEL=STUDY_JSON:VARIANT",
        help="a task's name, then one MODEL=STUDY_JSON:VARIANT per model size",
    )
    parser.add_argument(
        "--params",
        action="append",
        default=[],
        metavar="MODEL=COUNT",
        help="the single model's parameter count, where a study.json has none",
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to write into")
    args = parser.parse_args(argv)
    try:
        params = parse_params(args.params)
        tasks: dict[str, list[Entry]] = {}
        for name, *entries in args.task:
            if name in tasks:
                raise ValueError(f"task {name!r} given twice")
            if not entries:
                raise ValueError(f"task {name!r} names no MODEL=STUDY_JSON:VARIANT")
            tasks[name] = [parse_entry(text, params) for text in entries]
        named = {e.model for entries in tasks.values() for e in entries}
        if unknown := sorted(set(params) - named):
            raise ValueError(f"--params names {', '.join(unknown)}, which no --task names")
        figure = by_size_figure(tasks)
        markdown = by_size_markdown(tasks, figure=FIGURE)
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / FIGURE, figure)
    atomic_write_bytes(args.out / MARKDOWN, markdown.encode())
    print(f"wrote {args.out / MARKDOWN} and {args.out / FIGURE}")


if __name__ == "__main__":
    main()
