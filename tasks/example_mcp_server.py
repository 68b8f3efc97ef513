"""An example MCP server to register with the tool registry (docs/api.md, "Bring
your own tools"), built with the official SDK's server API (``MCPServer``)
and served over Streamable HTTP by uvicorn:

    .venv/bin/python -m tasks.example_mcp_server --port 9100
    # → http://127.0.0.1:9100/mcp

Its tools, as a thread sees them once it is registered as ``example``:

* ``example.list_notes`` and ``example.read_note`` — read-only
  (``readOnlyHint``), so a lost answer is a plain failure;
* ``example.add_note`` — a side effect (no read-only hint: ``external_effect``),
  so a lost answer is an unknown effect, settled honestly, never replayed.

The notes live in this process's memory.
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

NOTES: dict[str, str] = {
    "welcome": "This note came from the example MCP server.",
    "limits": "Every tool call is admitted from the run's tool-call budget first.",
}


def build() -> MCPServer:
    server = MCPServer("example", instructions="Notes kept in memory.")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="List the notes")
    def list_notes() -> list[str]:
        return sorted(NOTES)

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Read one note")
    def read_note(title: str) -> str:
        if title not in NOTES:
            raise ValueError(f"there is no note called {title!r}")
        return NOTES[title]

    @server.tool(
        annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False),
        description="Add or replace a note",
    )
    def add_note(title: str, text: str) -> str:
        NOTES[title] = text
        return f"saved {title!r} ({len(text)} characters)"

    return server


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args(argv)
    print(f"example MCP server: http://{args.host}:{args.port}/mcp", flush=True)
    uvicorn.run(build().streamable_http_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
