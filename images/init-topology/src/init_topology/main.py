"""init-topology: read this pod's Node, write /etc/inject/env, exit.

Exit codes: 0 written (also when degraded: the Node could not be read, NODE_NAME and what
the downward API gave are written, with one warning line); 2 bad setting; 3 the Node could
not be read and TOPOLOGY_STRICT is true (nothing written); 4 the file could not be written.
Every expected failure is one line on stderr, `init-topology: <level>: <what> -- <fix>`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from init_topology import __version__
from init_topology.config import ConfigError, load_config
from init_topology.envfile import write_env_file
from init_topology.mapping import build_variables
from init_topology.nodeapi import NodeObject, NodeUnavailable, fetch_node

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_NODE_UNAVAILABLE = 3
EXIT_WRITE = 4

SUMMARY_KEYS = (
    "NODE_PROVIDER",
    "NODE_ZONE",
    "NODE_INSTANCE_TYPE",
    "NODE_GPU_COUNT",
    "NODE_GPU_MODEL",
    "NODE_CAPACITY_TYPE",
    "NODE_FABRIC",
)


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_for_log(text: str) -> str:
    """`text` with every character a terminal would act on or break a line at written as an
    escape: control characters (ESC, CR, NL, BEL, C1 such as CSI), line and paragraph
    separators, bidi and other format characters, lone surrogates (stderr cannot encode
    them). Printable text, non-ASCII letters included, is left as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    if c in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[c]
    code = ord(c)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def _summary_value(value: str) -> str:
    """A value in the summary's `key=value` list: bare when plain, else JSON-quoted so that
    spaces, quotes and backslashes cannot blur where one value ends (the formatter then
    escapes what JSON leaves raw)."""
    if not value:
        return "-"
    if value.isprintable() and not any(c in value for c in ' "\\'):
        return value
    return json.dumps(value, ensure_ascii=False)


class _Formatter(logging.Formatter):
    """One line per record, whatever bytes a label, the API server or a setting held: the
    env file keeps values byte-exact, the log shows them escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return escape_for_log(f"init-topology: {record.levelname.lower()}: {record.getMessage()}")


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if os.environ.get("TOPOLOGY_DEBUG") == "true" else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="init-topology",
        description="Write this pod's node topology to TOPOLOGY_OUTPUT (default "
        "/etc/inject/env). Configured by environment only; see the image README.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.parse_args(argv)
    _setup_logging()

    try:
        config = load_config(os.environ)
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG

    node: NodeObject | None = None
    try:
        node = fetch_node(config)
    except NodeUnavailable as exc:
        line = f'cannot read Node "{config.node_name}": {exc.cause} -- {exc.fix}'
        if config.strict:
            log.error("%s; failing because TOPOLOGY_STRICT is true", line)
            return EXIT_NODE_UNAVAILABLE
        log.warning("%s; writing NODE_NAME without node labels", line)

    variables = build_variables(config, node)
    try:
        write_env_file(config.output, variables)
    except (OSError, ValueError) as exc:
        log.error(
            "cannot write %s: %s -- mount a writable volume (the chart's emptyDir `inject`) at %s",
            config.output,
            exc,
            config.output.parent,
        )
        return EXIT_WRITE

    summary = " ".join(
        f"{key.removeprefix('NODE_').lower()}={_summary_value(variables[key])}"
        for key in SUMMARY_KEYS
        if key in variables
    )
    log.info(
        "wrote %d variables to %s (node %s%s)",
        len(variables),
        config.output,
        config.node_name,
        f": {summary}" if summary else "",
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
