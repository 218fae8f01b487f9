"""The web UI in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium) against a real ``postroom serve``: log in, watch a queue's depth change as messages
are published, peek a message, filter dead letters by reason and redrive them back to the queue
they died in, add a user and a permission and log in as that user, and see an action refused
to a monitoring user (closing another user's connection). Each main page is written as a
screenshot to ``docs/screenshots/``."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom.broker.tools.testing import free_port, wait_for_port
from tests.integration.test_crash import ROOT, broker

pytestmark = pytest.mark.integration

SCREENSHOTS = ROOT / "docs" / "screenshots"

#: Headless, in a window the size of a laptop's screen.
CHROMIUM_ARGUMENTS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)

PROGRAMS = {"chromium": shutil.which("chromium"), "chromedriver": shutil.which("chromedriver")}


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = [name for name, path in PROGRAMS.items() if path is None]
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("selenium")
    if missing:
        message = f"the browser tests need {', '.join(missing)} (scripts/test installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = PROGRAMS["chromium"]
    for argument in CHROMIUM_ARGUMENTS:
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=PROGRAMS["chromedriver"])
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def until(check: Callable[[], Any], seconds: float = 20.0) -> Any:
    """``check()``'s first truthy answer within ``seconds`` (the page refreshes itself)."""
    deadline = time.monotonic() + seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            answer = check()
            if answer:
                return answer
        except Exception as error:  # (an element replaced by a refresh while it was read)
            last_error = error
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s (last error: {last_error!r})")


def type_into(driver: Any, element_id: str, text: str) -> None:
    """Type ``text`` into a field, again if a refresh replaced the page meanwhile (once a field
    has the focus, the page is left alone until it loses it)."""
    from selenium.webdriver.common.by import By

    def typed() -> bool:
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(text)
        return bool(field.get_attribute("value") == text)

    until(typed)


def click(driver: Any, element_id: str) -> None:
    """Click a button, again if a refresh replaced it between finding and clicking it."""
    from selenium.webdriver.common.by import By

    until(lambda: driver.find_element(By.ID, element_id).click() or True)


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def log_in(driver: Any, http: int, user: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"http://127.0.0.1:{http}/#/overview")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    until(lambda: driver.find_element(By.ID, "login-user"))
    driver.find_element(By.ID, "login-user").send_keys(user)
    driver.find_element(By.ID, "login-password").send_keys(password)
    driver.find_element(By.ID, "login").click()
    until(lambda: user in text_of(driver, "#who"))


def screenshot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def api(http: int, path: str, user: str = "guest:guest") -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http}/api/{path}",
        headers={"Authorization": "Basic " + base64.b64encode(user.encode()).decode()},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_an_operator_watches_peeks_redrives_and_manages_users_in_the_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    http = free_port()
    with broker(tmp_path / "data", management=http) as (_process, port):
        wait_for_port(http, 30)
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = connection.channel()
        channel.exchange_declare("dlx", "fanout", durable=True)
        channel.queue_declare("orders.dead", durable=True)
        channel.queue_bind("orders.dead", "dlx")
        arguments = {"x-dead-letter-exchange": "dlx", "x-delivery-limit": 5}
        channel.queue_declare("orders", durable=True, arguments=arguments)
        channel.confirm_delivery()

        log_in(browser, http, "guest", "guest")
        browser.get(f"http://127.0.0.1:{http}/#/queues")
        until(lambda: "orders" in text_of(browser, "#page"))
        ready = lambda: [  # noqa: E731
            row.find_elements(By.TAG_NAME, "td")[4].text
            for row in browser.find_elements(By.CSS_SELECTOR, "#page tbody tr")
            if row.find_elements(By.TAG_NAME, "td")[1].text == "orders"
        ]
        until(lambda: ready() == ["0"])
        for number in range(3):
            body = json.dumps({"order": number, "note": "paid"}).encode()
            channel.basic_publish("", "orders", body, pika.BasicProperties(delivery_mode=2, headers={"region": "eu"}))
        until(lambda: ready() == ["3"])  # the table refreshes on its own
        screenshot(browser, "queues")

        browser.get(f"http://127.0.0.1:{http}/#/queue/%2F/orders")
        until(lambda: browser.find_element(By.ID, "peek"))
        Select(browser.find_element(By.ID, "peek-mode")).select_by_value("json")
        click(browser, "peek")
        first = until(lambda: browser.find_element(By.CSS_SELECTOR, "#peeked pre.body").text)
        assert json.loads(first) == {"order": 0, "note": "paid"}
        assert api(http, "queues/%2F/orders")["messages_ready"] == 3  # a peek takes nothing
        browser.execute_script("document.getElementById('peeked').scrollIntoView()")
        screenshot(browser, "queue")

        for _ in range(2):  # two die, rejected; one stays
            method, _properties, _body = channel.basic_get("orders")
            channel.basic_reject(method.delivery_tag, requeue=False)
        browser.get(f"http://127.0.0.1:{http}/#/dead-letters")
        until(lambda: "rejected 2" in text_of(browser, "#page table"))
        until(lambda: browser.find_element(By.PARTIAL_LINK_TEXT, "orders.dead").click() or True)
        until(lambda: browser.find_element(By.ID, "dead-filter"))
        Select(browser.find_element(By.ID, "dead-reason")).select_by_value("expired")
        click(browser, "dead-filter")
        until(lambda: text_of(browser, "#dead-count").startswith("0 of 2"))
        Select(browser.find_element(By.ID, "dead-reason")).select_by_value("rejected")
        click(browser, "dead-filter")
        until(lambda: text_of(browser, "#dead-count").startswith("2 of 2"))
        screenshot(browser, "dead-letters")
        click(browser, "redrive-filtered")
        until(lambda: "done: 2 moved" in text_of(browser, "#redrive-progress"))
        assert api(http, "queues/%2F/orders")["messages_ready"] == 3  # back where they died
        assert api(http, "queues/%2F/orders.dead")["messages_ready"] == 0
        browser.get(f"http://127.0.0.1:{http}/#/overview")
        until(lambda: text_of(browser, "#total-ready .value") == "3")
        screenshot(browser, "overview")

        browser.get(f"http://127.0.0.1:{http}/#/users")
        until(lambda: browser.find_element(By.ID, "add-user"))
        type_into(browser, "new-user", "watcher")
        type_into(browser, "new-password", "watcherpw")
        type_into(browser, "new-tags", "monitoring")
        click(browser, "add-user")
        until(lambda: "watcher" in text_of(browser, "#page table"))
        Select(browser.find_element(By.ID, "perm-user")).select_by_value("watcher")
        click(browser, "grant")
        until(lambda: any(p["user"] == "watcher" for p in api(http, "permissions")))
        screenshot(browser, "users")

        log_in(browser, http, "watcher", "watcherpw")
        assert "Users" not in text_of(browser, "#nav")  # not for a monitoring user
        browser.get(f"http://127.0.0.1:{http}/#/connections")  # monitoring: every connection is shown ...
        until(lambda: browser.find_element(By.CSS_SELECTOR, "#page tbody button.danger").click() or True)
        until(lambda: browser.switch_to.alert).accept()
        until(lambda: "Refused" in text_of(browser, "#status"))  # ... but only an administrator closes guest's
        connection.process_data_events(time_limit=0.5)
        assert connection.is_open
        screenshot(browser, "refused")
        connection.close()
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_the_dead_letter_reports_in_the_configured_folder_are_listed_and_opened(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from postroom.spark.report import render_html
    from postroom.spark.transforms import Summary

    folder = tmp_path / "reports"
    for name, total, reason in (("2026-11-27", 12, "expired"), ("2026-11-28", 40, "rejected")):
        summary = Summary(
            total, 3, {reason: total}, {"orders": total}, {"orders.dead": total}, 0,
            "2026-11-27T10:00:00", "2026-11-28T10:00:00", top_headers=[("region", "eu", total)],
        )  # fmt: skip
        (folder / name).mkdir(parents=True)
        (folder / name / "summary.json").write_text(json.dumps(summary.as_json()))
        (folder / name / "report.html").write_text(render_html(summary, {}))
        written = time.time() - (3600 if name.endswith("27") else 0)
        os.utime(folder / name / "summary.json", (written, written))
    http = free_port()
    with broker(tmp_path / "data", management=http, extra=f'ui: {{reports: "{folder}"}}\n') as (_process, _port):
        wait_for_port(http, 30)
        log_in(browser, http, "guest", "guest")
        browser.get(f"http://127.0.0.1:{http}/#/reports")
        until(lambda: "2026-11-28" in text_of(browser, "#page table"))
        rows = until(lambda: [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#page tbody tr")])
        assert rows[0].startswith("2026-11-28") and "rejected 40" in rows[0] and "expired 12" in rows[1]
        until(lambda: browser.find_element(By.LINK_TEXT, "2026-11-28").click() or True)
        until(lambda: browser.find_element(By.ID, "report-open"))
        by_reason = until(
            lambda: [
                cell.text
                for cell in browser.find_elements(By.CSS_SELECTOR, "#page table")[1].find_elements(By.TAG_NAME, "td")
            ]
        )
        assert by_reason == ["rejected", "40"]
        assert "region" in text_of(browser, "#page")
        screenshot(browser, "reports")

        link = until(lambda: browser.find_element(By.ID, "report-open").get_attribute("href"))
        click(browser, "report-open")  # the HTML report, in a tab of its own, with its own style
        until(lambda: len(browser.window_handles) == 2)
        browser.switch_to.window(browser.window_handles[1])
        until(lambda: "Dead letters" in text_of(browser, "h1"))
        assert browser.execute_script("return getComputedStyle(document.body).marginTop") == "32px"  # (2em: styled)
        assert "rejected" in text_of(browser, "body")
        for forged in (link.replace("ticket=", "ticket=0"), link.replace("2026-11-28", "2026-11-27")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(forged, timeout=10)  # a link opens only the report it was made for
            assert refused.value.code == 404
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_an_operator_declares_binds_publishes_and_unbinds_in_the_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    http = free_port()
    with broker(tmp_path / "data", management=http) as (_process, _port):
        wait_for_port(http, 30)
        log_in(browser, http, "guest", "guest")

        browser.get(f"http://127.0.0.1:{http}/#/queues")
        until(lambda: browser.find_element(By.ID, "add-queue"))
        type_into(browser, "new-queue-name", "invoices")
        type_into(browser, "new-queue-arguments", '{"x-delivery-limit": 3}')
        click(browser, "add-queue")
        queue = until(lambda: next((q for q in api(http, "queues") if q["name"] == "invoices"), None))
        assert queue["arguments"] == {"x-delivery-limit": 3} and queue["durable"] is True

        browser.get(f"http://127.0.0.1:{http}/#/exchanges")
        until(lambda: browser.find_element(By.ID, "add-exchange"))
        type_into(browser, "exchange-name", "billing")
        Select(browser.find_element(By.ID, "exchange-type")).select_by_value("topic")
        click(browser, "add-exchange")
        until(lambda: api(http, "exchanges/%2F/billing")["type"] == "topic")
        until(lambda: browser.find_element(By.LINK_TEXT, "billing").click() or True)

        until(lambda: browser.find_element(By.ID, "bind"))
        type_into(browser, "bind-destination", "invoices")
        type_into(browser, "bind-key", "invoice.*")
        click(browser, "bind")
        until(lambda: [b["routing_key"] for b in api(http, "exchanges/%2F/billing/bindings/source")] == ["invoice.*"])
        until(lambda: "invoice.*" in text_of(browser, "#page table"))
        for key, answer in (("invoice.paid", "Published and routed."), ("refund.paid", "not routed")):
            type_into(browser, "publish-key", key)
            type_into(browser, "publish-body", key)
            click(browser, "publish")
            until(lambda answer=answer: answer in text_of(browser, "#publish-result"))
        assert api(http, "queues/%2F/invoices")["messages_ready"] == 1  # only what the binding routed
        screenshot(browser, "exchange")

        browser.get(f"http://127.0.0.1:{http}/#/queue/%2F/invoices")
        until(lambda: browser.find_element(By.ID, "peek"))
        Select(browser.find_element(By.ID, "peek-ackmode")).select_by_value("ack_requeue_false")
        click(browser, "peek")
        assert until(lambda: browser.find_element(By.CSS_SELECTOR, "#peeked pre.body").text) == "invoice.paid"
        assert api(http, "queues/%2F/invoices")["messages_ready"] == 0  # taken, as asked
        type_into(browser, "bind-source", "amq.direct")
        type_into(browser, "bind-key", "invoices")
        click(browser, "bind")
        until(lambda: [b["source"] for b in api(http, "queues/%2F/invoices/bindings")] == ["", "amq.direct", "billing"])

        browser.get(f"http://127.0.0.1:{http}/#/bindings")
        until(lambda: "invoice.*" in text_of(browser, "#page table"))
        screenshot(browser, "bindings")

        def unbind() -> bool:
            row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#page tbody tr") if "invoice.*" in r.text)
            row.find_element(By.CSS_SELECTOR, "button.danger").click()
            return True

        until(unbind)
        until(lambda: browser.switch_to.alert).accept()
        until(lambda: api(http, "exchanges/%2F/billing/bindings/source") == [])

        shovel = {"src-uri": "amqp://", "src-queue": "invoices", "dest-uri": "amqp://", "dest-queue": "invoices.copy"}
        put(http, "parameters/shovel/%2F/copier", {"value": shovel})
        browser.get(f"http://127.0.0.1:{http}/#/shovels")
        until(lambda: "copier" in text_of(browser, "#page table") and "running" in text_of(browser, "#page table"))
        screenshot(browser, "shovels")
        # (a refresh may replace the button between finding and clicking it)
        until(lambda: browser.find_element(By.XPATH, "//button[text()='Delete']").click() or True)
        until(lambda: browser.switch_to.alert).accept()
        until(lambda: api(http, "shovels") == [] and "No shovels." in text_of(browser, "#page"))
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def put(http: int, path: str, body: Any) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http}/api/{path}",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    urllib.request.urlopen(request, timeout=10).close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """Three Postroom nodes on one etcd member."""
    from postroom.broker.tools.cluster_lab import EtcdMissing, Lab, etcd_members

    (tmp_path / "etcd").mkdir()
    try:
        with etcd_members(1, tmp_path / "etcd") as urls:
            lab = Lab(tmp_path, urls, prefix="ui")
            lab.start_all()
            try:
                yield lab
            finally:
                lab.stop_all()
            assert lab.tracebacks() == [], lab.logs()
    except EtcdMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(str(missing))
        pytest.skip(str(missing))


def test_the_overview_shows_the_nodes_of_a_cluster(browser: Any, cluster: Any) -> None:
    from selenium.webdriver.common.by import By

    lab = cluster
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    follower = next(name for name in lab.nodes if name != leader)
    http = lab.nodes[follower].management  # (a follower forwards it to the leader)
    log_in(browser, http, "guest", "guest")

    def rows() -> list[list[str]]:
        table = browser.find_element(By.CSS_SELECTOR, "#nodes table")
        return [
            [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")
        ]

    shown = until(lambda: [row[:4] for row in rows()] if len(rows()) == 3 else None)
    assert shown == [
        [
            f"postroom@{name}" + (" (serving this page)" if name == leader else ""),
            "leader" if name == leader else "follower",
            "yes",
            "yes",
        ]
        for name in sorted(lab.nodes)
    ]
    lags = {row[0]: row[5] for row in rows()}
    assert lags[f"postroom@{leader} (serving this page)"] == ""
    assert all(lags[f"postroom@{name}"].isdigit() for name in lab.nodes if name != leader), lags
    screenshot(browser, "cluster")
