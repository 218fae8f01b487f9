"""The management API and the web UI under load (Postroom only).

* ``queues``: ``--queues`` queues are declared, then ``GET /api/queues?page=1&page_size=100``
  (what the UI's queue table asks) is timed ``--requests`` times, and so are the same page
  sorted by ready messages and filtered by a name: the median and the slowest, in ms;
* ``ui``: the transient scenario of ``bench/amqp_load.py`` (``--seconds`` each), alternately
  without and with the web UI open: a headless Chromium (Debian's, through selenium) logged
  in on the overview page, refreshing every 5 seconds as it does, then on the queues page;
  ``--runs`` pairs, and the ratio of the medians (with / without).

    python bench/management.py [--scenarios queues,ui] [--queues 50000] [--requests 20]
        [--seconds 8] [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import generate, postroom  # noqa: E402
from postroom.broker.tools.testing import free_port, wait_for_port  # noqa: E402


def get(http: int, path: str) -> float:
    """Milliseconds ``GET /api/PATH`` took as guest (the whole answer read)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{http}/api/{path}",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


def declare_queues(port: int, count: int) -> float:
    """Declare ``count`` queues (``q-000001`` ...); seconds it took."""
    import pika

    started = time.monotonic()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    for number in range(count):
        channel.queue_declare(f"q-{number:06d}", arguments={"x-max-length": 1000})
    connection.close()
    return time.monotonic() - started


def scenario_queues(args: argparse.Namespace, result: dict[str, Any]) -> None:
    http = free_port()
    with postroom(listen=f'management: "tcp:{http}:interface=127.0.0.1"') as (port, _pid):
        wait_for_port(http, 30)
        seconds = declare_queues(port, args.queues)
        print(f"declared {args.queues:,} queues in {seconds:.1f} s", file=sys.stderr)
        asks = {
            "page 1 of 100": "queues?page=1&page_size=100",
            "page 1 of 100, sorted by ready, reversed": (
                "queues?page=1&page_size=100&sort=messages_ready&sort_reverse=true"
            ),
            "page 1 of 100, filtered by name": "queues?page=1&page_size=100&name=q-0499",
            "one queue": "queues/%2F/q-025000",
        }
        for label, path in asks.items():
            get(http, path)  # (once before timing: the first answer builds nothing it keeps, but warms up)
            times = [get(http, path) for _ in range(args.requests)]
            result[label] = {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
            print(f"{label}: median {statistics.median(times):.1f} ms, slowest {max(times):.1f} ms", file=sys.stderr)


def open_ui(http: int) -> Any:
    """A headless Chromium logged in on the UI's overview page."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"))
    driver.get(f"http://127.0.0.1:{http}/#/overview")
    driver.find_element(By.ID, "login-user").send_keys("guest")
    driver.find_element(By.ID, "login-password").send_keys("guest")
    driver.find_element(By.ID, "login").click()
    return driver


def scenario_ui(args: argparse.Namespace, result: dict[str, Any]) -> None:
    http = free_port()
    rates: dict[str, list[float]] = {"without": [], "with": []}
    with postroom(listen=f'management: "tcp:{http}:interface=127.0.0.1"') as (port, pid):
        wait_for_port(http, 30)
        for run in range(args.runs):
            for mode in ("without", "with") if run % 2 == 0 else ("with", "without"):
                driver = open_ui(http) if mode == "with" else None
                try:
                    if driver is not None and run % 2:
                        driver.get(f"http://127.0.0.1:{http}/#/queues")
                    records = generate(port, pid, "transient", "16", [], args)
                finally:
                    if driver is not None:
                        driver.quit()
                rate = sum(float(record.get("consumed_msgs_per_s") or 0) for record in records)
                rates[mode].append(rate)
                print(f"run {run + 1}, UI {mode}: {rate:,.0f} msg/s", file=sys.stderr)
    without, with_ui = statistics.median(rates["without"]), statistics.median(rates["with"])
    result["transient 16 B msg/s"] = {"without UI": rates["without"], "with UI": rates["with"]}
    result["ratio with / without"] = round(with_ui / without, 3) if without else None
    print(f"transient 16 B, medians: {without:,.0f} without the UI, {with_ui:,.0f} with it", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="queues,ui")
    parser.add_argument("--queues", type=int, default=50_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d")}
    for name in args.scenarios.split(","):
        result[name] = {}
        {"queues": scenario_queues, "ui": scenario_ui}[name](args, result[name])
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
