"""Load on `attn-mt serve` (continuous batching) against offline translation of the same sentences.

Starts `attn-mt serve` on 127.0.0.1 (a free port), then takes turns, round after round, between:
  - server-N, for each N of --clients (1 8 32): N closed-loop clients, one sentence per request;
  - offline-N: `translate_nbest` with batch size N on the same sentences in this process (what
    `attn-mt translate --batch-size N` does; offline-1 times each sentence, for its latency);
  - mixed: one request of --big sentences among 8 single-sentence clients (its latency, and theirs);
  - big: that request alone, and offline-big: those sentences translated offline in one batch;
  - baseline<i>-8 (each --baseline CHECKOUT): the same 8 clients against the server of another
    checkout (a git worktree of an older commit), started the same way, with --baseline-checkpoint.
Server-1 and offline-1 use the first --single sentences, the rest all --sentences. Every request has
a timeout and the request count is fixed; errors are counted. Medians over the rounds; the
background load (os.getloadavg) is recorded around every run.

    python scripts/serve_load.py --checkpoint /path/to/checkpoint.pt \\
        --src /path/to/multi30k/test2016.de --threads 1 --out-json docs/serve_load.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import torch

from attn_mt.checkpoint import load_model
from attn_mt.data.lines import read_lines
from attn_mt.decoding.translate import translate_nbest
from attn_mt.device import machine
from attn_mt.measure.timing import alternate


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: Path, threads: int, checkout: Path | None = None,
                 device: str = "cpu") -> tuple[subprocess.Popen, str]:
    """`attn-mt serve` in its own process (of `checkout`'s code when given), with `threads` torch
    threads."""
    port = free_port()
    cmd = [sys.executable, "-m", "attn_mt", "--quiet", "serve", "--checkpoint", str(checkpoint),
           "--host", "127.0.0.1", "--port", str(port), "--device", device, "--max-queue", "128"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, cwd=checkout)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"attn-mt serve exited with status {server.returncode}")
        try:
            httpx.get(f"{url}/api/info", timeout=2).raise_for_status()
            return server, url
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("attn-mt serve did not answer within 120 s")


def percentiles(latencies: list[float]) -> dict:
    if not latencies:  # nothing answered: the errors say why
        return {"p50_ms": None, "p95_ms": None}
    q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else latencies * 19
    return {"p50_ms": round(1000 * statistics.median(latencies), 1),
            "p95_ms": round(1000 * q[18], 1)}


def clients(url: str, requests: list[list[str]], n: int, beam: int, timeout: float) -> dict:
    """n closed-loop threads share the requests; latencies, errors, wall time and the answers
    (texts).

    Each client keeps one connection (http.client, keep-alive): it costs about a third of httpx's
    CPU per request, which on a small machine is taken from the server being measured."""
    todo, lock = iter(range(len(requests))), threading.Lock()
    latencies, errors, answers = [None] * len(requests), [], [None] * len(requests)
    host, port = urlsplit(url).hostname, urlsplit(url).port

    def client() -> None:
        http = HTTPConnection(host, port, timeout=timeout)
        try:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                try:
                    http.request("POST", "/api/translate",
                                 json.dumps({"texts": requests[i], "beam": beam}).encode(),
                                 {"Content-Type": "application/json"})
                    r = http.getresponse()
                    data = r.read()
                    if r.status != 200:
                        raise ValueError(f"status {r.status}: {data[:200]!r}")
                    answers[i] = [x["hypotheses"][0]["text"] for x in json.loads(data)["results"]]
                except (OSError, HTTPException, KeyError, ValueError) as e:
                    errors.append(f"{i}: {type(e).__name__}: {e}")
                    http.close()  # a fresh connection for the next request
                    continue
                latencies[i] = time.perf_counter() - t0
        finally:
            http.close()

    threads = [threading.Thread(target=client) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [x for x in latencies if x is not None]
    sentences = sum(len(r) for r, x in zip(requests, latencies, strict=True) if x is not None)
    return {"seconds": round(wall, 3), "sentences_per_s": round(sentences / wall, 2),
            "answered": len(done), "requests": len(requests), "n_errors": len(errors),
            "errors": errors[:10], **percentiles(done), "latencies": latencies, "answers": answers}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    model, cfg, tok = load_model(args.checkpoint, args.device)
    sentences = read_lines(args.src)[: args.sentences]
    single, big = sentences[: args.single], sentences[: args.big]
    dcfg = replace(cfg.decode, beam_size=args.beam, nbest=1)
    servers = {"server": start_server(args.checkpoint, args.threads, device=args.device)}
    for i, checkout in enumerate(args.baseline or [], 1):
        servers[f"baseline{i}"] = start_server(args.baseline_checkpoint or args.checkpoint,
                                               args.threads, checkout)
    # the reference
    offline_text = [n[0].text for n in translate_nbest(model, tok, sentences, dcfg, args.device)]
    for _, url in servers.values():
        clients(url, [[s] for s in sentences[:64]], 8, args.beam, args.timeout)
    runs: dict[str, dict] = {}

    def offline(batch: int, texts: list[str]) -> dict:
        """translate_nbest at batch size `batch`; at batch 1 each sentence is timed (its
        latency)."""
        t0, latencies, out = time.perf_counter(), [], []
        if batch == 1:
            for s in texts:
                t1 = time.perf_counter()
                out += [n[0].text for n in translate_nbest(model, tok, [s],
                                                           replace(dcfg, batch_size=1),
                                                           args.device)]
                latencies.append(time.perf_counter() - t1)
        else:
            out = [n[0].text for n in translate_nbest(model, tok, texts,
                                                      replace(dcfg, batch_size=batch), args.device)]
        wall = time.perf_counter() - t0
        return {"seconds": round(wall, 3), "sentences_per_s": round(len(texts) / wall, 2),
                **(percentiles(latencies) if latencies else {}), "answers": out}

    def mixed(url: str) -> dict:
        """One request of the big sentences among 8 single-sentence clients sending the others."""
        box: dict = {}
        t = threading.Thread(
            target=lambda: box.update(clients(url, [big], 1, args.beam, args.timeout)))
        t.start()
        small = clients(url, [[s] for s in sentences[args.big:]], 8, args.beam, args.timeout)
        t.join()
        return {"big_seconds": box["seconds"], "big_errors": box["n_errors"], "small": small,
                "seconds": max(box["seconds"], small["seconds"])}

    def one(name: str) -> float:
        before = load1()
        kind, _, n = name.partition("-")
        url = servers[kind if kind.startswith("baseline") else "server"][1]
        if kind == "offline":
            runs[name] = offline(len(big) if n == "big" else int(n), big if n == "big" else
                                 single if n == "1" else sentences)
        elif kind == "mixed":
            runs[name] = mixed(url)
        elif n == "big":
            runs[name] = clients(url, [big], 1, args.beam, args.timeout)
        else:
            served = httpx.get(f"{url}/api/info").json()["served"]
            runs[name] = clients(url, [[s] for s in (single if n == "1" else sentences)], int(n),
                                 args.beam, args.timeout)
            after = httpx.get(f"{url}/api/info").json()["served"]
            # older servers
            rows = after.get("rows", after["sentences"]) - served.get("rows", served["sentences"])
            runs[name]["mean_batch"] = round(rows / max(1, after["batches"] - served["batches"]), 2)
            runs[name]["calls_per_s"] = round((after["batches"] - served["batches"])
                                              / runs[name]["seconds"], 1)
        runs[name]["loadavg_1min"] = [before, load1()]
        return runs[name]["seconds"]

    names = ([f"server-{n}" for n in args.clients] + [f"offline-{n}" for n in args.clients]
             + ["mixed", "server-big", "offline-big"]
             + [f"{b}-8" for b in servers if b != "server"])
    rounds: list[dict] = []

    def end_of_round(name: str, r: int, seconds: float) -> None:
        if len(runs) < len(names):
            return
        for key, result in runs.items():
            answers = result.pop("answers", None)
            result.pop("latencies", None)
            if "small" in result:  # the mixed run's single-sentence clients
                result["small"].pop("answers", None)
                result["small"].pop("latencies", None)
            if answers is not None and key.endswith(("-8", "-32")):
                flat = [a[0] if isinstance(a, list) else a for a in answers]
                result["same_text_as_offline"] = sum(a == b for a,
                                                     b in zip(flat, offline_text, strict=True))
        rounds.append(dict(runs))
        runs.clear()
        print(f"round {r + 1}: " + ", ".join(f"{k} {v.get('sentences_per_s', v['seconds'])}"
                                            for k, v in rounds[-1].items()), file=sys.stderr)

    try:
        alternate({name: functools.partial(one, name) for name in names}, args.rounds,
                  after=end_of_round)
    finally:
        for server, _ in servers.values():
            server.terminate()
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
    return summary(args, rounds, len(sentences))


def summary(args: argparse.Namespace, rounds: list[dict], n_sentences: int) -> dict:
    def med(name: str, key: str, sub: str | None = None) -> float:
        return round(statistics.median((r[name][sub] if sub else r[name])[key] for r in rounds), 2)

    out: dict = {
        "command": "python scripts/serve_load.py --checkpoint CHECKPOINT --src SRC " + " ".join(
            f"--{k} {getattr(args, k)}" for k in ("sentences", "single", "big", "beam", "rounds",
                                                  "threads", "timeout")) + " --clients "
        + " ".join(map(str, args.clients)), "checkpoint": Path(args.checkpoint).name,
        "src": Path(args.src).name, "sentences": n_sentences, "single_sentences": args.single,
        "big_request": args.big, "beam": args.beam, "rounds": args.rounds, "threads": args.threads,
        "timeout_s": args.timeout,
    }
    for n in args.clients:
        server, offline = (med(f"server-{n}", "sentences_per_s"),
                           med(f"offline-{n}", "sentences_per_s"))
        out[f"clients_{n}"] = {"server_sentences_per_s": server, "offline_sentences_per_s": offline,
                               "ratio": round(server / offline, 3),
                               "p50_ms": med(f"server-{n}", "p50_ms"),
                               "p95_ms": med(f"server-{n}", "p95_ms"),
                               "mean_batch": med(f"server-{n}", "mean_batch")}
    if 1 in args.clients:
        out["clients_1"]["offline_p50_ms"] = med("offline-1", "p50_ms")
        out["clients_1"]["p50_vs_offline"] = round(out["clients_1"]["p50_ms"]
                                                   / out["clients_1"]["offline_p50_ms"], 3)
    big, offline_big = med("server-big", "seconds"), med("offline-big", "seconds")
    out["big_alone"] = {"server_seconds": big, "offline_seconds": offline_big,
                        "ratio": round(big / offline_big, 3)}
    out["mixed"] = {"big_seconds": med("mixed", "big_seconds"),
                    "small_p50_ms": med("mixed", "p50_ms", "small"),
                    "small_p95_ms": med("mixed", "p95_ms", "small"),
                    "small_sentences_per_s": med("mixed", "sentences_per_s", "small")}
    out["baselines_8"] = []
    for i, checkout in enumerate(args.baseline or [], 1):
        base = med(f"baseline{i}-8", "sentences_per_s")
        out["baselines_8"].append({"checkout": Path(checkout).name, "server_sentences_per_s": base,
                                   "p50_ms": med(f"baseline{i}-8", "p50_ms"),
                                   "p95_ms": med(f"baseline{i}-8", "p95_ms"), "speedup": round(
                                       out["clients_8"]["server_sentences_per_s"] / base, 3)})
    out["all_answered"] = all(
        v.get("n_errors", 0) == 0 and v.get("big_errors", 0) == 0
        and v.get("answered", 1) == v.get("requests", 1) and v.get("small", {}).get("n_errors", 0)
        == 0 for r in rounds for v in r.values())
    out["loadavg_1min"] = sorted({x for r in rounds for v in r.values() for x in v["loadavg_1min"]})
    out["machine"], out["rounds_detail"] = machine(torch.device(args.device)), rounds
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--src", type=Path, required=True, help="one sentence a line, e.g. test2016.de")
    p.add_argument("--sentences", type=int, default=1000, help="the first N lines")
    p.add_argument("--single", type=int, default=200,
                   help="sentences for the one-client and batch-1 runs")
    p.add_argument("--big", type=int, default=64, help="sentences of the one big request")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="torch threads, both sides")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument("--device", default="cpu", help="of the server and the offline runs: cpu or "
                   "cuda")
    p.add_argument("--baseline", type=Path, action="append",
                   help="another checkout whose server is measured with 8 clients (may be "
                   "repeated)")
    p.add_argument("--baseline-checkpoint", type=Path,
                   help="the checkpoint for it (default: --checkpoint)")
    p.add_argument("--out-json", type=Path)
    args = p.parse_args()
    if 8 not in args.clients and args.baseline:
        p.error("--baseline is compared at 8 clients: include 8 in --clients")
    if args.sentences <= args.big:
        p.error(f"--sentences {args.sentences}: must be more than --big {args.big} (the mixed "
                "load's small clients send the rest)")
    report = run(args)
    for n in args.clients:
        c = report[f"clients_{n}"]
        print(f"{n} clients: {c['server_sentences_per_s']} sentences/s (p50 {c['p50_ms']} ms, p95 "
              f"{c['p95_ms']} ms, mean batch {c['mean_batch']}); offline batch {n}: "
              f"{c['offline_sentences_per_s']}; ratio {c['ratio']}")
    print(f"{args.big} sentences in one request: {report['big_alone']}; mixed: {report['mixed']}")
    for base in report["baselines_8"]:
        print(f"baseline server {base['checkout']}, 8 clients: {base}")
    print(f"all answered: {report['all_answered']}; load average {report['loadavg_1min']}")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
