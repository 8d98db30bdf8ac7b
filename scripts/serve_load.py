"""Load on `attn-mt serve`: concurrent clients against batch translation of the same sentences.

Starts `attn-mt serve` on 127.0.0.1 (a free port) and, round after round, takes turns between
  - server, N clients: N threads send one sentence per request until every sentence is answered;
  - server, 1 client: one sentence at a time (the latency of a single sentence);
  - batch: `decode.translate_nbest` on all the sentences in this process (what `attn-mt translate` does).
Every request has a timeout and the request count is fixed; any error or timeout is counted and
reported. Medians over the rounds; the background load (os.getloadavg) is recorded around every run.

    python scripts/serve_load.py --checkpoint /path/to/checkpoint.pt \\
        --src /path/to/multi30k/test2016.de --out-json docs/serve_load.json
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
from pathlib import Path

import httpx
import torch

from attn_mt.checkpoint import load_model
from attn_mt.data.sources import read_lines
from attn_mt.decoding.search import translate_nbest
from attn_mt.device import machine
from attn_mt.measure.timing import alternate


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    """`attn-mt serve` in its own process, with the same torch threads as the batch runs here."""
    cmd = [sys.executable, "-m", "attn_mt", "--quiet", "serve", "--checkpoint", str(args.checkpoint),
           "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"attn-mt serve exited with status {server.returncode}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/info", timeout=2).raise_for_status()
            return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("attn-mt serve did not answer within 120 s")


def clients(url: str, sentences: list[str], n: int, beam: int, timeout: float) -> dict:
    """n threads share the sentences, one per request; latencies, errors, wall time and the answers."""
    todo, lock = iter(range(len(sentences))), threading.Lock()
    latencies, errors, answers = [], [], [None] * len(sentences)

    def client() -> None:
        with httpx.Client(base_url=url, timeout=timeout) as http:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                try:
                    r = http.post("/api/translate", json={"texts": [sentences[i]], "beam": beam})
                    r.raise_for_status()
                    answers[i] = r.json()["results"][0]["hypotheses"][0]["text"]
                except (httpx.HTTPError, KeyError, ValueError) as e:
                    errors.append(f"{i}: {type(e).__name__}: {e}")
                    continue
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=20) if len(latencies) > 1 else latencies * 19
    return {"seconds": round(wall, 3), "sentences_per_s": round(len(latencies) / wall, 2),
            "answered": len(latencies), "errors": errors[:10], "n_errors": len(errors),
            "p50_ms": round(1000 * statistics.median(latencies), 1), "p95_ms": round(1000 * q[18], 1),
            "answers": answers}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    model, cfg, tok = load_model(args.checkpoint, "cpu")
    sentences = read_lines(args.src)[: args.sentences]
    single = sentences[: args.single]
    dcfg = replace(cfg.decode, beam_size=args.beam, nbest=1)
    port = free_port()
    server = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    rounds: list[dict] = []
    try:
        clients(url, sentences[:64], args.clients, args.beam, args.timeout)  # warm-up both sides
        translate_nbest(model, tok, sentences[:64], dcfg)
        runs: dict[str, dict] = {}
        batch: list[str] = []

        def one(name: str) -> float:
            """One timed run of `name` into runs[name]; its wall-clock seconds."""
            before = load1()
            if name == "batch":
                t0 = time.perf_counter()
                batch[:] = [n[0].text for n in translate_nbest(model, tok, sentences, dcfg)]
                wall = time.perf_counter() - t0
                runs[name] = {"seconds": round(wall, 3), "sentences_per_s": round(len(sentences) / wall, 2)}
            else:
                n, texts = (args.clients, sentences) if name == "server" else (1, single)
                served = httpx.get(f"{url}/api/info").json()["served"]
                runs[name] = clients(url, texts, n, args.beam, args.timeout)
                after = httpx.get(f"{url}/api/info").json()["served"]
                runs[name]["mean_batch"] = round((after["sentences"] - served["sentences"])
                                                 / max(1, after["batches"] - served["batches"]), 2)
            runs[name]["loadavg_1min"] = [before, load1()]
            return runs[name]["seconds"]

        def end_of_round(name: str, r: int, seconds: float) -> None:
            if len(runs) < 3:
                return
            answers = runs["server"].pop("answers")
            runs["single"].pop("answers")
            runs["server"]["same_text_as_batch"] = sum(a == b for a, b in zip(answers, batch, strict=True))
            rounds.append(dict(runs))
            runs.clear()
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['sentences_per_s']} sent/s" for k, v in rounds[-1].items()),
                  file=sys.stderr)

        # the three take turns, each first in one round of three (measure.timing's rotating rounds)
        alternate({name: functools.partial(one, name) for name in ("server", "single", "batch")}, args.rounds,
                  after=end_of_round)
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
    return summary(args, rounds, len(sentences))


def summary(args: argparse.Namespace, rounds: list[dict], n_sentences: int) -> dict:
    def med(name: str, key: str) -> float:
        return round(statistics.median(r[name][key] for r in rounds), 2)

    server, batch = med("server", "sentences_per_s"), med("batch", "sentences_per_s")
    return {
        "command": "python scripts/serve_load.py --checkpoint CHECKPOINT --src SRC " + " ".join(
            f"--{k} {getattr(args, k)}" for k in ("sentences", "single", "clients", "beam", "rounds", "threads",
                                                   "timeout")),
        "checkpoint": Path(args.checkpoint).name, "src": Path(args.src).name, "sentences": n_sentences,
        "beam": args.beam, "clients": args.clients, "rounds": args.rounds, "timeout_s": args.timeout,
        "server_sentences_per_s": server, "batch_sentences_per_s": batch, "ratio": round(server / batch, 3),
        "server_p50_ms": med("server", "p50_ms"), "server_p95_ms": med("server", "p95_ms"),
        "server_mean_batch": med("server", "mean_batch"),
        "single_client_p50_ms": med("single", "p50_ms"), "single_client_p95_ms": med("single", "p95_ms"),
        "single_client_sentences": args.single,
        "all_answered": all(r[k]["answered"] == (n_sentences if k == "server" else args.single) and
                            not r[k]["n_errors"] for r in rounds for k in ("server", "single")),
        "loadavg_1min": sorted({x for r in rounds for v in r.values() for x in v["loadavg_1min"]}),
        "machine": machine(torch.device("cpu")), "rounds_detail": rounds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--src", type=Path, required=True, help="one sentence a line, e.g. test2016.de")
    p.add_argument("--sentences", type=int, default=1000, help="the first N lines")
    p.add_argument("--single", type=int, default=200, help="sentences for the one-client latency run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads, both sides")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument("--out-json", type=Path)
    args = p.parse_args()
    report = run(args)
    print(f"{report['clients']} clients: {report['server_sentences_per_s']} sentences/s "
          f"(p50 {report['server_p50_ms']} ms, p95 {report['server_p95_ms']} ms, mean batch "
          f"{report['server_mean_batch']}); batch translate "
          f"{report['batch_sentences_per_s']} sentences/s; ratio {report['ratio']}; one client: "
          f"p50 {report['single_client_p50_ms']} ms, p95 {report['single_client_p95_ms']} ms; "
          f"all answered: {report['all_answered']}; load average {report['loadavg_1min']}")
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
