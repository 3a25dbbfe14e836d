"""`inferenceos version`: InferenceOS, llama.cpp build, Python and backends."""

from __future__ import annotations

import platform
import sys
from typing import Annotated, Any

import typer

import inferenceos
from inferenceos.cli.console import out, print_json
from inferenceos.hardware.llama_devices import probe_llama


def version_info() -> dict[str, Any]:
    """Versions of everything that matters, as one flat-ish dict."""
    ll = probe_llama()
    return {
        "inferenceos": inferenceos.__version__,
        "llama_cpp_python": ll.package_version,
        "ggml_version": ll.ggml_version,
        "ggml_commit": ll.ggml_commit,
        "backends": ll.backends,
        "llama_error": ll.error,
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def version(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Show the versions of InferenceOS, llama.cpp (build and commit), Python and backends."""
    info = version_info()
    if as_json:
        print_json(info)
        return
    out.print(f"InferenceOS {info['inferenceos']}")
    if info["llama_error"]:
        out.print(f"llama.cpp: [red]{info['llama_error']}[/]")
    else:
        out.print(f"llama-cpp-python {info['llama_cpp_python']} (ggml {info['ggml_version']}, "
                  f"commit {info['ggml_commit']}); backends: {', '.join(info['backends'])}")
    out.print(f"Python {info['python']} on {info['platform']}")
