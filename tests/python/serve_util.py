"""Starts `cedar serve` on a free loopback port for the e2e tests and the load bench."""
import os
import re
import signal
import subprocess
import time
import urllib.request

from cedar_cli import cedar_binary


class CedarServer:
    """`cedar serve ARGS --port 0`; the port is read from the 'listening on' line on stderr."""

    def __init__(self, args=(), timeout_s=120.0):
        self.proc = subprocess.Popen([cedar_binary(), "serve", "--port", "0", *args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr_lines = []
        deadline = time.time() + timeout_s
        self.port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr_lines.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("cedar serve did not start: " + "".join(self.stderr_lines) + self.proc.stderr.read())
        self.base_url = f"http://127.0.0.1:{self.port}"

    def get(self, path, headers=None):
        req = urllib.request.Request(self.base_url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()

    def metric(self, name):
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self, sig=signal.SIGTERM, timeout_s=30.0):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rest = self.proc.stderr.read() if self.proc.stderr else ""
        self.stderr_lines.append(rest)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
