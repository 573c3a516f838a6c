"""`numawb serve` (and llama-server, when given) under 1, 4 and 8 concurrent clients, in one run
(a benchmark, not a test).

    python3 benchmarks/serve_bench.py [-m MODEL] [-np 8] [-c 1,4,8] [-n 128] [-t 2] [-r 3]
                                      [--llama-server PATH] [--load 200] [--prompt-tokens 2048 --ctx 4096]
                                      [--json]

For each server (a fresh process each): start it on a free loopback port with `-np` slots, warm
it up, then for each client count run `-r` rounds in which every client streams one completion
of `-n` tokens (`ignore_eos`, greedy unless `--temp`, a different prompt per client) at once. Aggregate decode
throughput = tokens received after each client's first one, summed over clients, divided by the
time from the first client's first token to the last client's last token (prompt processing
excluded, the same clock for both servers). Best round reported. The single-stream rate is
compared with `numawb generate` (same prompt, -n and threads) in a fresh process.

`--load N` adds the fault run: N requests of random lengths from 8 clients, a quarter closed
midway, run twice; every request must complete or be cancelled by its client, nothing may
hang, and the server's RSS must return to its level (from /proc after a warm-up round, after
the run and after the second one). The outcomes reported are the second run's.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how a bicycle works.", "The history of Rome",
           "List some uses of copper:", "Once upon a time in a small village,", "def quicksort(items):",
           "A recipe for bread:", "The weather today is", "Dear diary,", "In the beginning"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a loopback port; `kind` is 'numawb' or 'llama-server'."""

    def __init__(self, kind: str, cmd: list[str], port: int):
        self.kind, self.port = kind, port
        self.log = open(os.path.join("/tmp", f"serve_bench_{kind}_{port}.log"), "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not start (see {self.log.name})")
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            return ok
        except OSError:
            return False

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def stream(port: int, prompt: str | list[int], n: int, temperature: float = 0.0, seed: int = 0, ignore_eos: bool = True,
           close_after: int | None = None) -> dict:
    """One streamed /v1/completions request; token arrival times, the server's timings.
    close_after: the client goes away after that many chunks, or after that many quarter seconds
    when no chunk comes (a random-weight file's tokens print nothing, so they stream nothing)."""
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": temperature, "seed": seed,
                       "stream": True, "ignore_eos": ignore_eos, "cache_prompt": False})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = {"status": r.status, "times": [], "finish": None, "timings": None, "t0": t0}
    chunks = 0
    if r.status != 200:
        out["error"] = r.read().decode(errors="replace")
        c.close()
        return out
    timer = None
    if close_after is not None:
        def hang_up() -> None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        timer = threading.Timer(0.25 * close_after, hang_up)
        timer.start()
    while True:
        try:
            line = r.readline()
        except OSError:
            line = b""
        if not line and close_after is not None and not out["finish"]:
            out["finish"] = "closed"
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        ch = ev.get("choices") or [{}]
        chunks += 1
        if ch[0].get("text"):
            out["times"].append(time.perf_counter())
        if ch[0].get("finish_reason"):
            out["t_end"] = time.perf_counter()
            out["finish"] = ch[0]["finish_reason"]
            out["timings"] = ev.get("timings")
            out["completion_tokens"] = (ev.get("usage") or {}).get("completion_tokens")
        # closed after that many chunks, text or not (a random-weight file's tokens print nothing)
        if close_after is not None and chunks >= close_after and not out["finish"]:
            out["finish"] = "closed"
            break
    if timer is not None:
        timer.cancel()
    c.close()
    return out


TEMPERATURE = 0.0  # --temp: the timed rounds' sampling temperature (0: greedy)
PROMPT_TOKENS = 0  # --prompt-tokens: each client's prompt as that many token ids (MLA slots at depth)
BY_TIMINGS = False  # --by-timings: each request's decode span from the server's timings, not text arrivals


def prompt_of(i: int) -> str | list[int]:
    """Client i's prompt: one of PROMPTS, or with --prompt-tokens that many token ids (seeded by i;
    ids 100-249, in every vocabulary), the same for both servers."""
    if not PROMPT_TOKENS:
        return PROMPTS[i % len(PROMPTS)]
    return random.Random(1000 + i).choices(range(100, 250), k=PROMPT_TOKENS)


def concurrent_round(port: int, clients: int, n: int, round_: int) -> dict:
    with ThreadPoolExecutor(clients) as ex:
        res = list(ex.map(lambda i: stream(port, prompt_of(i + round_), n, TEMPERATURE, seed=i),
                          range(clients)))
    bad = [r for r in res if r["status"] != 200 or r["finish"] is None]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed: {bad[0].get('error', bad[0].get('finish'))}")
    if BY_TIMINGS:
        # each request decoded its tokens after the first over the server's predicted_ms, ending
        # when its last chunk arrived: the same span as the arrival clock, for streams whose
        # tokens print nothing (a file with random weights and a toy vocabulary)
        spans = [(r["t_end"] - (r["timings"] or {}).get("predicted_ms", 0.0) / 1e3, r["t_end"],
                  max(int((r["timings"] or {}).get("predicted_n", 0)) - 1, 0)) for r in res]
        first, last = min(a for a, _, _ in spans), max(b for _, b, _ in spans)
        tokens = sum(k for _, _, k in spans)
    else:
        if any(not r["times"] for r in res):
            raise RuntimeError("a stream printed no text to time (random weights?): rerun with --by-timings")
        first = min(r["times"][0] for r in res)
        last = max(r["times"][-1] for r in res)
        tokens = sum(len(r["times"]) - 1 for r in res)
    per_stream = [((r["timings"] or {}).get("predicted_per_second") or 0.0) for r in res]
    return {"aggregate_tps": tokens / (last - first) if last > first else 0.0,
            "stream_tps": statistics.mean(per_stream), "tokens": tokens}


def solo_passes(port: int) -> float:
    """numawb's count of passes run without its crew (`numawb_crew_solo_passes` in /metrics)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith("numawb_crew_solo_passes"):
            return float(line.split()[-1])
    return 0.0


def run_server(kind: str, cmd: list[str], port: int, levels: list[int], n: int, reps: int) -> dict:
    log(f"starting {kind}: {' '.join(cmd)}")
    srv = Server(kind, cmd, port)
    try:
        stream(port, "Hello", 8)  # warm-up (first passes compile or page in)
        concurrent_round(port, max(levels), 8, 0)
        out = {}
        for c in levels:
            solo0 = solo_passes(port) if kind == "numawb" else None
            rounds = [concurrent_round(port, c, n, r) for r in range(reps)]
            best = max(rounds, key=lambda r: r["aggregate_tps"])
            out[c] = best
            if solo0 is not None:   # passes the crew's starvation backoff ran on one thread
                best["solo_passes"] = solo_passes(port) - solo0
            log(f"{kind} clients={c}: aggregate {best['aggregate_tps']:.1f} t/s, "
                f"per stream {best['stream_tps']:.1f} t/s (rounds: "
                f"{', '.join('%.1f' % r['aggregate_tps'] for r in rounds)})"
                + (f", {best['solo_passes']:.0f} passes without the crew" if solo0 is not None else ""))
        return out
    finally:
        rc = srv.stop()
        log(f"{kind} stopped with exit status {rc}")


def load_run(cmd: list[str], port: int, n_requests: int) -> dict:
    """The fault run: random lengths, a quarter closed midway, 8 clients; RSS before and after."""
    srv = Server("numawb-load", cmd, port)
    rng = random.Random(12)
    plan = [(rng.randint(1, 96), i % 4 == 0, rng.randint(1, 8), rng.randint(0, len(PROMPTS) - 1))
            for i in range(n_requests)]
    try:
        with ThreadPoolExecutor(8) as ex:  # warm-up
            list(ex.map(lambda i: stream(port, PROMPTS[i], 32, 0.8, i, False), range(8)))
        time.sleep(1.0)
        base = srv.rss()
        t0 = time.perf_counter()

        def one(i: int) -> str:
            n, cancel, after, p = plan[i]
            r = stream(port, PROMPTS[p] + " " * (i % 3), n, 0.8, i, cancel, after if cancel else None)
            if r["status"] != 200:
                return f"error {r['status']}"
            return r["finish"] or "no-finish"
        afters = []
        for _ in range(2):  # twice: the second run shows whether memory keeps growing
            with ThreadPoolExecutor(8) as ex:
                outcomes = list(ex.map(one, range(n_requests), timeout=3600))
            wall = time.perf_counter() - t0
            time.sleep(2.0)  # closed streams are cancelled at the next pass
            afters.append(srv.rss())
            t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/health")
        health = json.loads(c.getresponse().read())
        counts = {k: outcomes.count(k) for k in sorted(set(outcomes))}
        return {"requests": n_requests, "outcomes": counts, "seconds": wall, "rss_before": base,
                "rss_after": afters[0], "rss_after_second_run": afters[1],
                "idle_after": health.get("slots_processing") == 0}
    finally:
        srv.stop()


def generate_rate(model: str | None, threads: int, n: int) -> float:
    cmd = [sys.executable, "-m", "workbench", "generate", "-p", PROMPTS[0], "-n", str(n), "--temp", "0",
           "-t", str(threads), "--json"] + (["-m", model] if model else [])
    best = 0.0
    for _ in range(2):
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        best = max(best, json.loads(out.stdout.strip().splitlines()[-1])["decode_tps"])
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF model (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("-np", "--parallel", type=int, default=8, help="slots of both servers (default: 8)")
    ap.add_argument("-c", "--clients", default="1,4,8", help="concurrent client counts (default: 1,4,8)")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="tokens per request (default: 128)")
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot (default: 1024)")
    ap.add_argument("-t", "--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="rounds per level (best reported)")
    ap.add_argument("--llama-server", metavar="PATH", help="llama-server binary: run it too, same settings")
    ap.add_argument("--load", type=int, default=0, metavar="N", help="also the fault run with N requests")
    ap.add_argument("--temp", type=float, default=0.0,
                    help="sampling temperature of the timed rounds (default 0: greedy; a file with random "
                         "weights may greedily repeat a token that prints nothing, which streams no text to time)")
    ap.add_argument("--by-timings", action="store_true",
                    help="time each request's decode by the server's timings (predicted_n, predicted_ms) and "
                         "its last chunk, not by text arrivals: for files whose tokens print nothing")
    ap.add_argument("--prompt-tokens", type=int, default=0, metavar="N",
                    help="each client's prompt as N token ids instead of a short text (slots at depth; "
                         "give --ctx above N + -n)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    global TEMPERATURE, BY_TIMINGS, PROMPT_TOKENS
    TEMPERATURE, BY_TIMINGS, PROMPT_TOKENS = args.temp, args.by_timings, args.prompt_tokens
    levels = [int(x) for x in args.clients.split(",")]
    if max(levels) > args.parallel:
        log(f"note: {max(levels)} clients on {args.parallel} slots: some wait for a slot")
    model = args.model
    if model is None:
        sys.path.insert(0, ROOT)
        from workbench.engine import default_model_path
        model = default_model_path()
    results: dict = {"model": os.path.basename(model), "parallel": args.parallel, "threads": args.threads,
                     "n_gen": args.n_gen, "prompt_tokens": args.prompt_tokens or None, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cpu": _cpu_name(), "servers": {}}
    port = free_port()
    numawb_cmd = [sys.executable, "-m", "workbench", "serve", "-m", model, "--port", str(port),
                  "-np", str(args.parallel), "-c", str(args.ctx * args.parallel), "-t", str(args.threads)]
    results["servers"]["numawb"] = run_server("numawb", numawb_cmd, port, levels, args.n_gen, args.repetitions)
    if args.llama_server:
        port = free_port()
        cmd = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np",
               str(args.parallel), "-c", str(args.ctx * args.parallel), "-t", str(args.threads)]
        results["servers"]["llama-server"] = run_server("llama-server", cmd, port, levels, args.n_gen,
                                                        args.repetitions)
    log("numawb generate (single stream, fresh process)")
    results["generate_tps"] = generate_rate(args.model, args.threads, args.n_gen)
    if args.load:
        log(f"fault run: {args.load} requests, a quarter closed midway")
        results["load"] = _load(numawb_cmd, args.load)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results, levels))
    return 0


def _load(cmd: list[str], n: int) -> dict:
    port = free_port()
    cmd = list(cmd)
    cmd[cmd.index("--port") + 1] = str(port)
    return load_run(cmd, port, n)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def table(res: dict, levels: list[int]) -> str:
    srv = res["servers"]
    both = "llama-server" in srv
    lines = [f"{res['model']}, {res['cpu']}, {res['threads']} threads, -np {res['parallel']}, "
             f"{res['n_gen']} tokens per request"
             + (f" after a {res['prompt_tokens']}-token prompt" if res.get("prompt_tokens") else "")
             + f", {res['date']}", ""]
    head = "| clients | numawb t/s (aggregate) | numawb t/s per stream |"
    sep = "|---:|---:|---:|"
    if both:
        head += " llama-server t/s (aggregate) | llama-server per stream | numawb / llama-server |"
        sep += "---:|---:|---:|"
    lines += [head, sep]
    for c in levels:
        a = srv["numawb"][c]
        row = f"| {c} | {a['aggregate_tps']:.1f} | {a['stream_tps']:.1f} |"
        if both:
            b = srv["llama-server"][c]
            row += f" {b['aggregate_tps']:.1f} | {b['stream_tps']:.1f} | " \
                   f"**{a['aggregate_tps'] / b['aggregate_tps']:.2f}x** |"
        lines.append(row)
    solos = {c: srv["numawb"][c].get("solo_passes") for c in levels}
    if any(v is not None for v in solos.values()):
        lines += ["", "numawb passes run without the crew (its starvation backoff) during each level's rounds: "
                  + ", ".join(f"{c} clients {v:.0f}" for c, v in solos.items() if v is not None)]
    one = srv["numawb"].get(1)
    if one and res.get("generate_tps"):   # (0: its tokens printed nothing to time)
        g = res["generate_tps"]
        lines += ["", f"single stream: serve {one['aggregate_tps']:.1f} t/s (at the client), "
                      f"numawb generate {g:.1f} t/s: {one['aggregate_tps'] / g:.2f}x"]
    if "load" in res:
        ld = res["load"]
        lines += ["", f"fault run: {ld['requests']} requests in {ld['seconds']:.0f} s, outcomes {ld['outcomes']}, "
                      f"idle after: {ld['idle_after']}, RSS {ld['rss_before'] / 2**20:.0f} -> "
                      f"{ld['rss_after'] / 2**20:.0f} MiB, after the same run again "
                      f"{ld['rss_after_second_run'] / 2**20:.0f} MiB"]
    return "\n".join(lines)


if __name__ == "__main__":
    threading.current_thread().name = "serve_bench"
    sys.exit(main())
