"""A fake Hugging Face Hub on 127.0.0.1 (random port), in-process, for pull tests.

It speaks the routes `huggingface_hub` and `registry/hub.py` call:
- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}` (model info; with
  `?blobs=true` each sibling carries `size`, `blobId` and `lfs: {sha256, size,
  pointerSize}`),
- `GET /api/models/{repo}/tree/{rev}` (the file list with LFS oids),
- `HEAD` / `GET /{repo}/resolve/{rev}/{file}` with `ETag`, `X-Repo-Commit`,
  `X-Linked-Etag`, `X-Linked-Size`, `Accept-Ranges` and `Range` (206, `Content-Range`),
  or a 302 to a second fake host (`cdn=True`), as the real Hub redirects LFS files.
Unknown repos answer 401 with `X-Error-Code: RepoNotFound`, as the Hub does.

Faults to inject: `cut[file] = n` closes the connection after n bytes of the next GET
of `file` (once; a list cuts the next GETs in turn); `slow_s` pauses after each 64 KiB
sent; `declared_sha[file]` lists a digest the bytes do not have; `token` makes the Hub
refuse requests without `Authorization: Bearer <token>`; `raw_siblings` adds file
entries as a hostile server would send them.
Every request is recorded in `requests` (method, path, Range, Authorization).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

import tiny_models
from tiny_models import SHAPES, write_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    auth: str | None


@dataclass
class FakeHub:
    """Repos {repo_id: {file path: bytes}} served on a loopback port."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    cut: dict[str, Any] = field(default_factory=dict)  # file → n, or [n, n, ...]
    declared_sha: dict[str, str] = field(default_factory=dict)
    raw_siblings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    token: str | None = None
    cdn: bool = False
    slow_s: float = 0.0  # a pause after each 64 KiB of a GET body (a slow link)
    requests: list[Seen] = field(default_factory=list)

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        if self.cdn:  # a second origin holding the bytes, as the real Hub's CDN does
            self.cdn_hub = FakeHub(repos=self.repos, cut=self.cut).start()
            self.cdn_hub.requests = self.requests
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self.cdn:
            self.cdn_hub.stop()

    def sha(self, repo: str, file: str) -> str:
        return self.declared_sha.get(file) or hashlib.sha256(self.repos[repo][file]).hexdigest()

    def gets(self, file: str) -> list[Seen]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + file)]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, data: Any) -> None:
            self._send(200, json.dumps(data).encode())

        def _no_repo(self) -> None:
            self._send(401, b'{"error":"Repository not found"}',
                       {"X-Error-Code": "RepoNotFound",
                        "X-Error-Message": "Repository not found"})

        def _route(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            hub.requests.append(Seen(self.command, path, self.headers.get("Range"),
                                     self.headers.get("Authorization")))
            if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self._no_repo()
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo = "/".join(parts[2:4])
                if repo not in hub.repos:
                    return self._no_repo()
                if len(parts) >= 6 and parts[4] == "tree":
                    return self._json(_tree(hub, repo))
                blobs = "blobs=true" in url.query.lower()
                return self._json(_info(hub, repo, blobs))
            if parts[:1] == ["cdn"] and len(parts) >= 4:  # /cdn/{org}/{repo}/{file}
                repo, file = "/".join(parts[1:3]), "/".join(parts[3:])
                return self._bytes(repo, file)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, file = "/".join(parts[:2]), "/".join(parts[4:])
                if repo not in hub.repos:
                    return self._no_repo()
                if file not in hub.repos[repo]:
                    return self._send(404, b'{"error":"Entry not found"}',
                                      {"X-Error-Code": "EntryNotFound"})
                if hub.cdn:
                    data = hub.repos[repo][file]
                    sha = hub.sha(repo, file)
                    return self._send(302, b"", {
                        "Location": f"{hub.cdn_hub.url}/cdn/{repo}/{file}",
                        "X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{sha}"',
                        "X-Linked-Size": str(len(data)), "ETag": '"pointer"'})
                return self._bytes(repo, file)
            return self._send(404, b'{"error":"not found"}')

        def _bytes(self, repo: str, file: str) -> None:
            data = hub.repos[repo][file]
            sha = hub.sha(repo, file)
            headers = {"ETag": f'"{sha}"', "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes",
                       "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))}
            start, status = 0, 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first)
                end = int(last) if last else len(data) - 1
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                data, status = data[start:end + 1], 206
            cut = _next_cut(hub, file) if self.command == "GET" else None
            if cut is None and hub.slow_s and self.command == "GET":
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for i in range(0, len(data), 65536):
                        self.wfile.write(data[i:i + 65536])
                        self.wfile.flush()
                        time.sleep(hub.slow_s)
                except OSError:  # the client went away
                    self.close_connection = True
                return None
            if cut is None:
                return self._send(status, data, headers, "application/octet-stream")
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the cut: the client sees the stream end early

        do_GET = do_HEAD = _route

    return Handler


def _next_cut(hub: FakeHub, file: str) -> int | None:
    """The byte count to cut the next GET of `file` at (an int: once; a list: in turn)."""
    plan = hub.cut.get(file)
    if isinstance(plan, list):
        cut = plan.pop(0) if plan else None
        if not plan:
            hub.cut.pop(file, None)
        return cut
    return hub.cut.pop(file, None)


def _info(hub: FakeHub, repo: str, blobs: bool) -> dict[str, Any]:
    siblings: list[dict[str, Any]] = []
    for name, data in hub.repos[repo].items():
        s: dict[str, Any] = {"rfilename": name}
        if blobs:
            s.update(size=len(data), blobId=hashlib.sha1(data).hexdigest(),
                     lfs={"sha256": hub.sha(repo, name), "size": len(data), "pointerSize": 134})
        siblings.append(s)
    siblings += hub.raw_siblings.get(repo, [])
    return {"_id": "x", "id": repo, "modelId": repo, "sha": COMMIT, "private": False,
            "siblings": siblings, "tags": ["gguf"]}


def _tree(hub: FakeHub, repo: str) -> list[dict[str, Any]]:
    return [{"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data),
             "path": name, "lfs": {"oid": hub.sha(repo, name), "size": len(data),
                                   "pointerSize": 134}}
            for name, data in hub.repos[repo].items()]


def tiny_gguf(tmp: Path, kind: str = "llama", seed: int = 0) -> bytes:
    """The bytes of a tiny model llama.cpp loads (tests/tiny_models.py)."""
    path = write_tiny_model(tmp / f"tiny-{kind}-{seed}.gguf", kind, seed=seed)
    return path.read_bytes()


def tiny_projector(path: Path, weights: str = "f16", name: str = "tiny-clip",
                   arch: str = "clip", audio: bool = False, seed: int = 0,
                   n_embd_text: int = 64) -> Path:
    """A small GGUF shaped like a projector header (`general.architecture` `arch`,
    `clip.projector_type` "mlp", matrices of `weights` type f16 / f32 / bf16 / q8_0,
    output width `n_embd_text`: the tiny llama's) for the projector finding rules;
    tests/tiny_vlm.py has one mtmd really loads."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", not audio)
    w.add_bool("clip.has_audio_encoder", audio)
    modality = "audio" if audio else "vision"
    w.add_uint32(f"clip.{modality}.embedding_length", 32)
    w.add_uint32(f"clip.{modality}.block_count", 1)
    w.add_uint32("clip.vision.image_size", 32)
    w.add_uint32("clip.vision.patch_size", 8)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])

    def matrix(tensor: str, rows: int, cols: int) -> None:
        m = rng.standard_normal((rows, cols)).astype(np.float32)
        if weights == "f16":
            w.add_tensor(tensor, m.astype(np.float16))
        elif weights == "f32":
            w.add_tensor(tensor, m)
        else:
            qtype = {"bf16": GGMLQuantizationType.BF16,
                     "q8_0": GGMLQuantizationType.Q8_0}[weights]
            w.add_tensor(tensor, quantize(m, qtype), raw_dtype=qtype)

    matrix("mm.0.weight", 64, 32)
    w.add_tensor("mm.0.bias", np.zeros(64, dtype=np.float32))
    matrix("mm.2.weight", n_embd_text, 64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_split_gguf(folder: Path, parts: int = 2, base: str = "tiny") -> list[Path]:
    """A tiny llama written as a split GGUF (`base-0000i-of-0000N.gguf`) in `folder`."""
    s = SHAPES["llama"]
    n_vocab = 3 + 256 + len(tiny_models.LETTERS)
    rng = np.random.default_rng(0)
    n_tensors = 3 + s.n_layer * 9
    w = GGUFWriter(str(folder / f"{base}.gguf"), s.arch,
                   split_max_tensors=-(-n_tensors // parts))
    tiny_models._add_metadata(w, s, n_vocab, tiny_models.CHATML_TEMPLATE)
    w.add_tensor("token_embd.weight",
                 (rng.standard_normal((n_vocab, s.n_embd)) * 0.1).astype(np.float32))
    for i in range(s.n_layer):
        tiny_models._add_layer(w, s, i, rng)
    w.add_tensor("output_norm.weight", np.ones(s.n_embd, dtype=np.float32))
    w.add_tensor("output.weight",
                 (rng.standard_normal((n_vocab, s.n_embd)) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(folder.glob(f"{base}-*-of-*.gguf"))
