"""The harness of `dev/hostile.py`: cases register with `@case(category)`, run `frugal` (a
`Run`), and judge a refusal by the names its error must carry (`refuses`)."""

import json
import os
import signal
import socket
import subprocess
import time

FRUGAL = "target/release/frugal"
TINY = ["--batch", "2", "--seq", "32", "--sample-tokens", "0"]
CASES = []
ERRORS = []  # (subcommand, stderr) of every refusal, for the flag check at the end


def case(category):
    def add(fn):
        CASES.append((category, fn.__name__, fn))
        return fn
    return add


class Run:
    def __init__(self, args, timeout=120, env=None):
        t = time.time()
        try:
            p = subprocess.run([FRUGAL] + args, capture_output=True, text=True, timeout=timeout,
                               env=env)
            self.rc, self.out, self.err, self.hung = p.returncode, p.stdout, p.stderr, False
        except subprocess.TimeoutExpired as e:
            self.rc, self.hung = None, True
            self.out = (e.stdout or b"").decode(errors="replace")
            self.err = (e.stderr or b"").decode(errors="replace")
        self.seconds = time.time() - t
        if not self.hung and self.rc not in (0, None):
            ERRORS.append((args[0], self.err))

    def panicked(self):
        return self.rc == 101 or "panicked at" in self.err or (self.rc is not None and self.rc < 0)


def refuses(args, *names, timeout=120):
    """A refusal whose error names each of `names` (case-insensitive)."""
    r = Run(args, timeout)
    if r.hung:
        return "hang", f"still running after {timeout} s"
    if r.panicked():
        return "panic", r.err.strip()[-200:]
    if r.rc == 0:
        return "wrong", "accepted: " + (r.out.strip()[-160:] or "no output")
    missing = [n for n in names if n.lower() not in r.err.lower()]
    first = r.err.strip().splitlines()[-1] if r.err.strip() else "(no message)"
    if missing:
        return "unclear", f"error does not name {missing}: {first[:200]}"
    return "handled", first[:160]


def train(w, name, model, *extra, steps=2):
    out = os.path.join(w, name)
    r = Run(["train", "--model", model, "--steps", str(steps), "--save-every", str(steps),
             "--out", out, "--json"] + TINY + list(extra))
    assert r.rc == 0, f"setting up {name}: {r.err[-300:]}"
    return out


def edited(w, src_dir, name, **fields):
    c = json.load(open(os.path.join(src_dir, "config.json")))
    c.update(fields)
    path = os.path.join(w, name + ".json")
    json.dump(c, open(path, "w"))
    return path


# ---- panic / hang -------------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, args, port):
        self.port = port
        self.p = subprocess.Popen([FRUGAL] + args + ["--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def alive_answer(self, path="/", timeout=5.0):
        """The status line of a GET, or None past `timeout` (a hang)."""
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).decode(errors="replace").split("\r\n")[0]
        except OSError:
            return None

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        return self.p.returncode


def raw(port, data, read=True, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    answer = s.recv(256).decode(errors="replace") if read else ""
    return s, answer



def resume_with(w, preset, name, **fields):
    out = train(w, name, preset)
    config = edited(w, out, name, **fields)
    return refuses(["train", "--model", config, "--resume", out, "--out", out, "--steps", "2",
                    "--save-every", "2"] + TINY, *[f for f in ("snapshot",)])


