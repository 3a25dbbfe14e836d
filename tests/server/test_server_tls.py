"""`serve --tls-cert/--tls-key`: HTTPS with uvicorn's own TLS, proven with a self-signed
certificate and the real `openai` client; bad TLS options are one line; binding beyond
loopback without a key or TLS warns and names what is exposed."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from cli_helpers import cli_env, run_cli


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key (openssl, 1 day)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    return cert, key


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tls_serve_answers_the_openai_client(tiny_llama: Path, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferenceos", "serve", str(tiny_llama), "--port", str(port),
         "--ctx", "256", "--threads", "1", "--parallel", "1", "--tls-cert", str(cert),
         "--tls-key", str(key)],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/health", verify=trust, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                               http_client=httpx.Client(verify=trust))
        out = client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert out.choices[0].finish_reason in ("stop", "length")
        # the certificate is what is trusted: an unverified default client refuses it
        with pytest.raises(httpx.ConnectError):
            httpx.get(base + "/health", timeout=5)
        # and plain HTTP on the TLS port gets no answer
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert f"https://127.0.0.1:{port}" in err and "Traceback" not in err
    # the openai client's idle keep-alive connection is still open: its TLS close used
    # to hold the exit for uvicorn's whole graceful timeout (grace 10 s + 5: 15.5 s);
    # 3.8 s now when quiet, 8.5 s once in a fresh clone's full suite on 2 busy cores
    assert time.monotonic() - stopping < 12, time.monotonic() - stopping


@pytest.mark.parametrize("which", ["cert-only", "missing-file", "not-pem"])
def test_bad_tls_options_are_one_line(which: str, tiny_llama: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    args = {"cert-only": ["--tls-cert", str(junk)],
            "missing-file": ["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(junk)],
            "not-pem": ["--tls-cert", str(junk), "--tls-key", str(junk)]}[which]
    r = run_cli("serve", str(tiny_llama), "--port", str(_free_port()), *args, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "--tls" in lines[0] and "Traceback" not in r.stderr


@pytest.mark.parametrize("key", [False, True])
def test_binding_beyond_loopback_warns_what_is_exposed(key: bool, tiny_llama: Path) -> None:
    """On a busy port `serve` stops at the bind check, after its warnings."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        extra = ["--api-key", "k"] if key else []
        r = run_cli("serve", str(tiny_llama), "--host", "0.0.0.0", "--port", str(port),
                    *extra, timeout=60)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and "cannot listen on 0.0.0.0" in text
    assert ("without an API key" in text) is not key
    assert "without TLS" in text and "clear text" in text
    assert ("and the API key" in text) is key
