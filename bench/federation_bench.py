"""Federation benchmark (by hand, not CI): the two SIONet routing modes' trade-off and the
end-to-end latency across sites (seed 000 §3.7.2; docs/federation.md "Benchmarks").

``modes``: the pure routers on a seeded 50-site random tree (simulation/federation.py). For a
ratio of filter registrations (subscribe + unsubscribe at random sites) to events (publishes at
random sites) it counts, per routing mode, the set-up messages (Register + Unregister sent over
links), the event messages (an event crossing a link) and the wasted ones (event crossings that
full-filter routing does not need: type-only crossings minus full-filter crossings of the same
workload). Writes JSON and a PNG.

``latency``: real broker processes, cloud <- regional_a <- edge_a and cloud <- regional_b <-
edge_b, paho clients: a publisher at edge_b, a subscriber at edge_a (edge -> regional -> cloud
-> regional -> edge, 4 links), paced messages (``--qos``) with a timestamp in the payload;
p50/p99, side by side with one stand-alone broker (publisher and subscriber on it) in the same
run; ``--tls`` adds the same chain with mutual TLS on its shared links, ``--durable`` the chain
with the SQLite store on (at QoS 1 every event's custody row is committed before the PUBACK and
every EventAck waits for a commit). The chains run one after the other.

    .venv/bin/python bench/federation_bench.py modes --out docs/federation_modes
    .venv/bin/python bench/federation_bench.py latency --messages 2000 --rate 200 --qos 1 \\
        --tls --durable --out docs/federation_latency.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from broker.federation.keys import RoutingMode  # noqa: E402
from broker.federation.messages import Event  # noqa: E402
from broker.federation.router import PlaceSettings  # noqa: E402
from simulation.federation import FederationNet  # noqa: E402

LEVELS = (("plant", "office", "fleet", "farm"), tuple("abcdefgh"), ("t", "h", "p", "v"))


def _filter(rng: random.Random) -> str:
    first = rng.choice(LEVELS[0])
    roll = rng.random()
    if roll < 0.1:
        return f"{first}/#"
    second = "+" if roll < 0.2 else rng.choice(LEVELS[1])
    return f"{first}/{second}/{rng.choice(LEVELS[2])}"


def _topic(rng: random.Random) -> str:
    return "/".join(rng.choice(words) for words in LEVELS)


def run_mode(mode: RoutingMode, sites: int, registrations: int, events: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    net = FederationNet(PlaceSettings("bench", mode=mode, class_levels=1))
    names = [f"s{i}" for i in range(sites)]
    for name in names:
        net.add(name)
    net.build_tree({name: rng.choice(names[:index]) for index, name in enumerate(names) if index})
    held: list[tuple[str, str]] = []
    total = registrations + events
    done_reg = done_ev = 0
    for _ in range(total):
        if done_ev >= events or (done_reg < registrations and rng.random() < registrations / total):
            done_reg += 1
            if held and rng.random() < 0.4:
                site, topic_filter = held.pop(rng.randrange(len(held)))
                net.do(site, net.routers[site].unsubscribe(topic_filter))
            else:
                site, topic_filter = rng.choice(names), _filter(rng)
                held.append((site, topic_filter))
                net.do(site, net.routers[site].subscribe(topic_filter))
        else:
            done_ev += 1
            site = rng.choice(names)
            net.do(site, net.routers[site].publish(Event(_topic(rng), b"")))
    return {
        "setup": net.sent["Register"] + net.sent["Unregister"],
        "events": net.sent["Event"],
        "deliveries": sum(len(log) for log in net.delivered.values()),
    }


def modes(args: argparse.Namespace) -> None:
    ratios = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
    rows = []
    for ratio in ratios:
        registrations = max(1, round(args.operations * ratio / (1 + ratio)))
        events = max(1, args.operations - registrations)
        full = run_mode(RoutingMode.FULL_FILTER, args.sites, registrations, events, args.seed)
        typed = run_mode(RoutingMode.TYPE_ONLY, args.sites, registrations, events, args.seed)
        row = {
            "ratio": ratio,
            "registrations": registrations,
            "events": events,
            "full_setup": full["setup"],
            "full_events": full["events"],
            "type_setup": typed["setup"],
            "type_events": typed["events"],
            "type_wasted": typed["events"] - full["events"],
            "full_total": full["setup"] + full["events"],
            "type_total": typed["setup"] + typed["events"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    meta = {"sites": args.sites, "operations": args.operations, "seed": args.seed, "machine": _machine()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = [row["ratio"] for row in rows]
    left.plot(x, [r["full_setup"] for r in rows], "o-", label="full filter: set-up messages")
    left.plot(x, [r["type_setup"] for r in rows], "s-", label="type only: set-up messages")
    left.plot(x, [r["type_wasted"] for r in rows], "^--", label="type only: wasted event messages")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("filter registrations / events")
    left.set_ylabel("messages over links")
    left.legend(fontsize=8)
    right.plot(x, [r["full_total"] / r["type_total"] for r in rows], "o-")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set_xscale("log")
    right.set_xlabel("filter registrations / events")
    right.set_ylabel("total messages: full filter / type only")
    fig.suptitle(f"SIONet routing modes, {args.sites} sites, {args.operations} operations (seed {args.seed})")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


# ---------------------------------------------------------------------------------- latency
def _machine() -> str:
    cpus = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    python = platform.python_version()
    return f"{platform.machine()} {platform.processor() or ''} {cpus} cores, Python {python}"


def latency(args: argparse.Namespace) -> None:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from broker.adapters.transport.tls import issue_broker_cert, make_ca
    from tools.ports import free_ports

    tmp = Path(tempfile.mkdtemp(prefix="skipmq-fed-bench-"))
    processes: list[subprocess.Popen[bytes]] = []

    ca_dir = tmp / "ca"
    make_ca(ca_dir)

    def start(
        name: str, upstream: int | None, federated: bool = True, *, tls: bool = False, durable: bool = False
    ) -> tuple[int, int, int]:
        mqtt, http, fed = free_ports(3)
        command = [
            sys.executable, "-m", "broker", "--port", str(mqtt), "--http-port", str(http),
            "--data-dir", str(tmp / name), "--node-id", name, "--log-level", "warning",
            "--set", f"store.persistence={'true' if durable else 'false'}", "--set", "sys.interval_s=0",
        ]  # fmt: skip
        if federated:
            command += ["--set", "federation.enabled=true", "--set", "federation.place=bench"]
            command += ["--set", f"federation.port={fed}"]
            if tls:
                cert, key = issue_broker_cert(ca_dir, f"127.0.0.1:{fed}", name=name)
                command += ["--set", f"federation.tls_ca_file={ca_dir / 'ca.pem'}"]
                command += ["--set", f"federation.tls_cert_file={cert}"]
                command += ["--set", f"federation.tls_key_file={key}"]
            else:
                command += ["--set", "federation.insecure=true"]
            if upstream is not None:
                command += ["--set", f"federation.upstream=127.0.0.1:{upstream}"]
        log = (tmp / f"{name}.log").open("wb")
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        return mqtt, http, fed

    def measure(sub_port: int, pub_port: int, ready: Any) -> list[float]:
        received: list[float] = []
        done = threading.Event()

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            received.append(time.perf_counter() - float(msg.payload.decode()))
            if len(received) >= args.messages:
                done.set()

        sub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-sub-{sub_port}")
        sub.on_message = on_message
        sub.connect("127.0.0.1", sub_port)
        sub.loop_start()
        sub.subscribe("bench/#", qos=args.qos)
        pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{pub_port}")
        pub.connect("127.0.0.1", pub_port)
        pub.loop_start()
        deadline = time.monotonic() + 15
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        warm = time.monotonic() + 1.0
        while time.monotonic() < warm:
            pub.publish("bench/warm", f"{time.perf_counter()}", qos=0)
            time.sleep(0.05)
        time.sleep(0.3)
        received.clear()
        interval = 1.0 / args.rate
        next_at = time.perf_counter()
        for _ in range(args.messages):
            next_at += interval
            pub.publish("bench/x", f"{time.perf_counter()}", qos=args.qos)
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        done.wait(15)
        for client in (pub, sub):
            client.disconnect()
            client.loop_stop()
        return received

    def summary(samples: list[float]) -> dict[str, float]:
        ms = sorted(1000 * s for s in samples)
        return {
            "n": len(ms),
            "p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 3),
            "max_ms": round(ms[-1], 3),
        }

    def chain(label: str, *, tls: bool = False, durable: bool = False) -> dict[str, float]:
        """cloud <- regional_a <- edge_a, cloud <- regional_b <- edge_b, measured, then stopped."""
        first = len(processes)
        tag = label.replace(" ", "_").replace(",", "")
        options = {"tls": tls, "durable": durable}
        try:
            _cloud_mqtt, _cloud_http, cloud_fed = start(f"cloud_{tag}", None, **options)
            _ra_mqtt, _ra_http, ra_fed = start(f"regional_a_{tag}", cloud_fed, **options)
            _rb_mqtt, _rb_http, rb_fed = start(f"regional_b_{tag}", cloud_fed, **options)
            ea_mqtt, _ea_http, _ = start(f"edge_a_{tag}", ra_fed, **options)
            eb_mqtt, eb_http, _ = start(f"edge_b_{tag}", rb_fed, **options)

            def path_ready() -> bool:
                with urllib.request.urlopen(f"http://127.0.0.1:{eb_http}/federation", timeout=1) as response:
                    state = json.loads(response.read())
                return any("f:bench/#" in keys for keys in state["received_from"].values())

            return summary(measure(ea_mqtt, eb_mqtt, path_ready))
        finally:
            for process in processes[first:]:
                process.terminate()
            for process in processes[first:]:
                process.wait(10)

    try:
        alone_mqtt, _alone_http, _ = start("alone", None, federated=False)
        results = {"stand-alone broker": summary(measure(alone_mqtt, alone_mqtt, lambda: True))}
        path = "edge -> regional -> cloud -> regional -> edge"
        results[f"{path}, plaintext"] = chain("plaintext")
        if args.tls:
            results[f"{path}, mTLS"] = chain("mTLS", tls=True)
        if args.durable:
            label = f"{path}, plaintext, store on (durable custody at QoS 1)"
            results[label] = chain("durable", durable=True)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait(10)
    report = {
        "machine": _machine(),
        "messages": args.messages,
        "rate_per_s": args.rate,
        "qos": args.qos,
        "results": results,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def puback(args: argparse.Namespace) -> None:
    """PUBACK latency of QoS 1 publishes at an edge broker whose events cross to a subscribed
    cloud: store on (each event's custody row joins the commit the PUBACK waits for) and off, and
    a stand-alone broker with its store on, one after the other in one run."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from tools.ports import free_ports

    tmp = Path(tempfile.mkdtemp(prefix="skipmq-fed-puback-"))

    def start(name: str, *, durable: bool, federated: bool, upstream: int | None = None) -> Any:
        mqtt, http, fed = free_ports(3)
        command = [
            sys.executable, "-m", "broker", "--port", str(mqtt), "--http-port", str(http),
            "--data-dir", str(tmp / name), "--node-id", name, "--log-level", "warning",
            "--set", f"store.persistence={'true' if durable else 'false'}", "--set", "sys.interval_s=0",
        ]  # fmt: skip
        if federated:
            command += ["--set", "federation.enabled=true", "--set", "federation.place=bench"]
            command += ["--set", f"federation.port={fed}", "--set", "federation.insecure=true"]
            if upstream is not None:
                command += ["--set", f"federation.upstream=127.0.0.1:{upstream}"]
        log = (tmp / f"{name}.log").open("wb")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        return process, mqtt, http, fed

    def acks(port: int) -> list[float]:
        pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{port}")
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        samples = []
        for serial in range(args.messages + 100):
            started = time.perf_counter()
            pub.publish("bench/x", b"x" * 64, qos=1).wait_for_publish(10)
            if serial >= 100:  # warm-up
                samples.append(time.perf_counter() - started)
        pub.disconnect()
        pub.loop_stop()
        return samples

    def summary(samples: list[float]) -> dict[str, float]:
        ms = sorted(1000 * s for s in samples)
        return {
            "n": len(ms),
            "p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 3),
        }

    results: dict[str, Any] = {}
    variants = [
        ("stand-alone broker, store on", True, False),
        ("federated edge, store on (durable custody)", True, True),
        ("federated edge, store off (custody in memory)", False, True),
    ]
    for label, durable, federated in variants:
        started: list[Any] = []
        try:
            edge_upstream = None
            if federated:
                cloud = start("cloud", durable=False, federated=True)
                started.append(cloud[0])
                sub = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-sub")
                sub.connect("127.0.0.1", cloud[1])
                sub.loop_start()
                sub.subscribe("bench/#", qos=1)
                edge_upstream = cloud[3]
            edge = start(f"edge-{len(results)}", durable=durable, federated=federated, upstream=edge_upstream)
            started.append(edge[0])
            if federated:
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{edge[2]}/federation", timeout=1
                    ) as response:
                        if any(
                            "f:bench/#" in keys
                            for keys in json.loads(response.read())["received_from"].values()
                        ):
                            break
                    time.sleep(0.1)
            results[label] = summary(acks(edge[1]))
            if federated:
                sub.disconnect()
                sub.loop_stop()
        finally:
            for process in started:
                process.terminate()
                process.wait(10)
    report = {"machine": _machine(), "messages": args.messages, "results": results}
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    modes_parser = commands.add_parser("modes", help="routing-mode trade-off on the pure routers")
    modes_parser.add_argument("--sites", type=int, default=50)
    modes_parser.add_argument("--operations", type=int, default=4000, help="registrations + events per point")
    modes_parser.add_argument("--seed", type=int, default=1)
    modes_parser.add_argument("--out", default="docs/federation_modes", help="path without suffix")
    latency_parser = commands.add_parser("latency", help="edge -> cloud -> edge latency, real processes")
    latency_parser.add_argument("--messages", type=int, default=2000)
    latency_parser.add_argument("--rate", type=float, default=200.0, help="messages per second")
    latency_parser.add_argument("--qos", type=int, default=0, choices=(0, 1), help="QoS of the messages")
    latency_parser.add_argument(
        "--tls", action="store_true", help="also measure the same chain with mutual TLS on the shared links"
    )
    latency_parser.add_argument(
        "--durable",
        action="store_true",
        help="also measure the chain with store.persistence on (with --qos 1: durable custody rows)",
    )
    latency_parser.add_argument("--out", default="", help="also write the JSON report here")
    puback_parser = commands.add_parser(
        "puback", help="QoS 1 PUBACK latency at a federated edge, store on/off"
    )
    puback_parser.add_argument("--messages", type=int, default=2000)
    puback_parser.add_argument("--out", default="", help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.command == "modes":
        modes(args)
    elif args.command == "puback":
        puback(args)
    else:
        latency(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
