"""``shmq console`` (tools/console/) against one real broker: every page and
every action, first over HTTP (what a page says, read from its HTML), then
in a real browser (Debian's headless Chromium, driven by chromedriver over
the W3C WebDriver protocol: plain HTTP and JSON, so no driver library),
with a screenshot of each page written to the module's tmp dir.

The module's world: a broker with message trace on, a topic, a traced
producer kept online (the producers page), a push consumer kept online
(the groups pages) that gives up on messages keyed ``dead-*`` once with
maxReconsumeTimes 0, so they land in %DLQ%<group>, and takes them when
they come back: the resend, followed to the consumer. The console runs as
``shmq console --port <free>``, sampling every 0.5 s.
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest

from shmq.client import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer

from brokerproc import free_port, ready_line, routed_topic, start_broker, until

TOPIC, GROUP, PGROUP = "ConsoleT", "console-cg", "console-pg"
FAST = dict(pull_time_delay_millis_when_exception=100, persist_consumer_offset_interval=0.5)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    b = start_broker(tmp, traceTopicEnable="true")
    console = None
    consumer = producer = None
    try:
        routed_topic(b, TOPIC, 2)
        consumed, gave_up = [], set()

        def listener(msgs, ctx):
            consumed.extend(msgs)
            m = msgs[0]
            if (m.keys or "").startswith("dead") and m.keys not in gave_up:
                gave_up.add(m.keys)
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(GROUP, namesrv_addr=b.namesrv, max_reconsume_times=0,
                                consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
        consumer.subscribe(TOPIC)
        consumer.register_message_listener(listener)
        consumer.start()
        producer = Producer(PGROUP, namesrv_addr=b.namesrv, enable_msg_trace=True)
        producer.start()
        sent = {k: producer.send(Message(TOPIC, f"body of {k} <b>".encode(), tags="TagA", keys=k))
                for k in ("order-1", "dead-1", "dead-2")}
        port = free_port()
        console = subprocess.Popen(
            [sys.executable, "-m", "shmq.tools", "console", "-n", b.namesrv, "--port", str(port),
             "--interval", "0.5"], stdout=subprocess.PIPE, stderr=open(tmp / "console.log", "w"),
            text=True)
        assert ready_line(console, 60).startswith(f"shmq console ready http://127.0.0.1:{port}/")
        yield SimpleNamespace(broker=b, url=f"http://127.0.0.1:{port}", sent=sent,
                              consumed=consumed, consumer=consumer, producer=producer, tmp=tmp)
    finally:
        if console is not None:
            console.terminate()
            console.wait(10)
        for c in (producer, consumer):
            if c is not None:
                c.shutdown()
        b.stop()
    log = (tmp / "console.log").read_text()
    assert "Traceback" not in log, log


def http(env, path: str, form: dict | None = None) -> tuple[int, str]:
    """GET ``path`` (POST ``form``): (status, the page's visible text)."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(env.url + path, data, timeout=30) as r:
            status, page = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, page = e.code, e.read().decode()
    assert page.startswith("<!DOCTYPE html>") and "Traceback" not in page, page
    return status, visible(page)


def visible(page: str) -> str:
    text = re.sub(r"<style>.*?</style>", "", page, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"\s+", " ", html.unescape(text))


def ok(env, path: str, form: dict | None = None) -> str:
    status, text = http(env, path, form)
    assert status == 200, text
    return text


def error_of(env, path: str, form: dict | None = None) -> str:
    status, text = http(env, path, form)
    assert status in (400, 404, 405), (status, text)
    return text


def q(path: str, **fields) -> str:
    return path + "?" + urllib.parse.urlencode(fields)


def dead_letter_id(env, key: str) -> str:
    """The offset msgId of the dead letter keyed ``key``, once it is there."""
    def find():
        status, page = raw(env, q("/messages", by="key", topic="%DLQ%" + GROUP, msgKey=key))
        m = re.search(r'href="/message\?msgId=([0-9A-F]+)"', page)
        return m and m.group(1)
    return until(find, f"{key} in %DLQ%{GROUP}", 20)


def raw(env, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(env.url + path, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ------------------------------------------------------------------ over HTTP
def test_cluster_page_shows_the_broker_and_charts_its_tps(env):
    text = ok(env, "/")
    b = env.broker
    assert f"DefaultCluster broker-a 0 {b.addr} V4_9_7" in text, text
    assert "Put TPS (10s 1m 10m)" in text and "TPS over time" in text
    # the sampler has drawn a line once it has two samples
    until(lambda: raw(env, "/cluster")[1].count("<polyline") == 2, "a TPS chart")
    text = ok(env, "/broker?addr=" + b.addr)
    assert f"Broker {b.addr}" in text and "commitLogDiskRatio" in text and "putTps" in text


def test_topics_create_route_status_send_delete(env):
    text = ok(env, "/topics")
    assert f"{TOPIC} DefaultCluster {GROUP}" in text, text
    assert f"%RETRY%{GROUP}" in text
    text = ok(env, "/topic/create", {"topic": "ConsoleNew", "clusterName": "DefaultCluster",
                                     "readQueueNums": "3", "writeQueueNums": "3", "perm": "6",
                                     "order": "false"})
    assert f"Topic ConsoleNew created on {env.broker.addr}" in text
    text = until(lambda: "Route" in (t := http(env, "/topic?topic=ConsoleNew")[1]) and t,
                 "ConsoleNew routed")
    assert "broker-a DefaultCluster 0=" + env.broker.addr in text
    assert "broker-a 3 3 6 0" in text                         # read, write queues, perm, sysflag
    assert "broker-a 2 0 0" in text                           # queue 2: min 0, max 0
    text = ok(env, "/topic/send", {"topic": "ConsoleNew", "body": "hi", "key": "k-new",
                                   "tags": "TagN"})
    assert re.search(r"Sent [0-9A-F]{32} \(SEND_OK\) to broker-a queue \d offset 0", text), text
    text = ok(env, "/topic?topic=ConsoleNew")
    assert re.search(r"broker-a \d 0 1 \d{4}-", text), text    # one queue now holds one message
    text = error_of(env, "/topic/delete", {"topic": "ConsoleNew", "clusterName": "DefaultCluster"})
    assert "Topic ConsoleNew" in text and "tick 'yes, delete ConsoleNew'" in text
    text = ok(env, "/topic/delete", {"topic": "ConsoleNew", "clusterName": "DefaultCluster",
                                     "confirm": "true"})
    assert "Topic ConsoleNew deleted from" in text and "ConsoleNew DefaultCluster" not in text
    assert "topic ConsoleNew does not exist" in error_of(env, "/topic?topic=ConsoleNew")


def test_messages_by_key_id_and_time_with_body_properties_and_trace(env):
    r = env.sent["order-1"]
    text = ok(env, q("/messages", by="key", topic=TOPIC, msgKey="order-1"))
    assert f"1 message(s) Message id Topic Tags Keys Broker Queue Offset Stored Body bytes " \
           f"{r.msg_id} {TOPIC} TagA order-1 broker-a" in text, text
    text = ok(env, q("/messages", by="id", msgId=r.msg_id, topic=TOPIC))
    assert f"{r.msg_id} {TOPIC} TagA order-1" in text
    text = ok(env, q("/messages", by="time", topic=TOPIC, beginTimestamp="0",
                     endTimestamp=str(int(time.time() * 1000))))
    assert "3 message(s)" in text and "dead-1" in text and "dead-2" in text
    # the message page: fields, properties, the body as text (escaped), its trace
    until(lambda: "Pub " in ok(env, q("/message", msgId=r.offset_msg_id)), "the Pub trace record")
    text = ok(env, q("/message", msgId=r.offset_msg_id))
    assert f"Message {r.msg_id}" in text and f"offsetMsgId {r.offset_msg_id}" in text
    assert "UNIQ_KEY " + r.msg_id in text and "KEYS order-1" in text
    assert "Body body of order-1 <b>" in text
    assert re.search(rf"Trace .*Pub \d{{4}}-\S+ \S+ {PGROUP} 127\.0\.0\.1:\d+ \d+ success 0 "
                     rf"{re.escape(env.broker.addr)}", text), text
    assert "Dead letter" not in text          # only a %DLQ% message can be resent


def test_consumer_groups_lag_connections_reset_and_skip(env):
    until(lambda: len(env.consumed) >= 3, "the consumer got the three messages")
    text = ok(env, "/groups")
    assert re.search(rf"{GROUP} 1 \d+ CONSUME_PASSIVELY CLUSTERING", text), text
    text = ok(env, "/group?group=" + GROUP)
    assert "Lag per queue" in text and f"{TOPIC} broker-a 0" in text and f"{TOPIC} broker-a 1" in text
    client_id = env.consumer._p.instance.client_id
    assert "CONSUME_PASSIVELY CLUSTERING" in text and client_id in text and f"{TOPIC} *" in text
    text = ok(env, "/group/reset", {"group": GROUP, "topic": TOPIC, "timestamp": "now",
                                    "force": "true"})
    assert f"Offsets of {GROUP} in {TOPIC} reset to now: sent to its consumers" in text, text
    assert re.search(r"Broker Queue New offset broker-a 0 \d+ broker-a 1 \d+", text), text
    text = ok(env, "/group/skip", {"group": GROUP, "topic": TOPIC})
    assert f"Backlog of {GROUP} in {TOPIC} skipped" in text
    assert re.search(r"Broker Queue New offset broker-a 0 \d+ broker-a 1 \d+", text), text


def test_producer_connections(env):
    text = ok(env, q("/producers", producerGroup=PGROUP, topic=TOPIC))
    client_id = env.producer._p.instance.client_id
    assert re.search(rf"Client id Address Language Version {re.escape(client_id)} \S+ PYTHON \d+",
                     text), text
    assert f"producer group nobody not found: no broker of topic {TOPIC} has a connection of it" in \
        error_of(env, q("/producers", producerGroup="nobody", topic=TOPIC))


def test_a_dead_letter_resent_reaches_its_group_again(env):
    dlq = dead_letter_id(env, "dead-1")
    text = ok(env, q("/message", msgId=dlq))
    assert f"%DLQ%{GROUP}" in text and f"Resend to consumer group {GROUP}" in text
    assert f"RETRY_TOPIC {TOPIC}" in text
    before = len([m for m in env.consumed if m.keys == "dead-1"])
    text = ok(env, "/message/resend", {"msgId": dlq})
    assert re.search(rf"Resent to %RETRY%{GROUP} at {re.escape(env.broker.addr)} queue 0 offset \d+",
                     text), text
    # the consumer takes it back as a message of its topic, with its msgId and body
    m = until(lambda: [m for m in env.consumed if m.keys == "dead-1"][before:], "dead-1 again")[0]
    assert (m.topic, m.msg_id, m.body) == (TOPIC, env.sent["dead-1"].msg_id, b"body of dead-1 <b>")
    assert "not a dead-letter topic" in error_of(
        env, "/message/resend", {"msgId": env.sent["order-1"].offset_msg_id})


@pytest.mark.parametrize("path, form, says", [
    ("/topic?topic=NoSuchTopic", None, "topic NoSuchTopic does not exist"),
    ("/topic?topic=bad%20name", None, "'bad name' is not a topic name"),
    ("/group?group=nobody", None, "consumer group nobody not found"),
    ("/messages?by=time&topic=ConsoleT&beginTimestamp=yesterday", None,
     "From (beginTimestamp): 'yesterday': want milliseconds or yyyy-MM-dd#HH:mm:ss:SSS"),
    ("/messages?by=key&topic=ConsoleT&msgKey=none-such", None, "no message with key none-such"),
    ("/message?msgId=ZZZ", None, "msgId 'ZZZ' is not hexadecimal"),
    ("/broker?addr=nowhere", None, "'nowhere' is not host:port"),
    ("/group/reset", {"group": GROUP, "topic": TOPIC, "timestamp": "noon"},
     "Time (timestamp): 'noon': want now,"),
    ("/topic/send", {"topic": TOPIC}, "a value is needed in: body"),
    ("/topic/create", {"topic": "T", "clusterName": "DefaultCluster", "readQueueNums": "0"},
     "Read queues (readQueueNums): 0 queues: want 1..1024"),
    ("/topic/create", None, "/topic/create takes a POST"),   # a GET of an action: 405
    ("/nowhere", None, "no page /nowhere"),
])
def test_bad_input_is_a_sentence_on_the_page(env, path, form, says):
    text = error_of(env, path, form)
    assert says in text, text


def test_another_sites_form_or_host_is_refused(env):
    """A page elsewhere cannot make the user's browser act here (CSRF), nor
    a DNS name rebound to 127.0.0.1 read it."""
    form = urllib.parse.urlencode({"topic": TOPIC, "clusterName": "DefaultCluster",
                                   "confirm": "true"}).encode()
    for headers, says in (({"Origin": "http://evil.example"},
                           "a form from http://evil.example may not act on this console"),
                          ({"Host": "evil.example:80"}, "Host 'evil.example:80' is not this console")):
        req = urllib.request.Request(env.url + "/topic/delete", form, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 403 and says in visible(e.value.read().decode())
    assert f"Topic {TOPIC}" in ok(env, "/topic?topic=" + TOPIC)        # still there


# ------------------------------------------------------------------ in a browser
class Browser:
    """A W3C WebDriver session of chromedriver driving headless Chromium."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

    def __init__(self, tmp):
        self.port = free_port()
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        until(lambda: self._ready(), "chromedriver listening")
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp / 'chromium-profile'}", "--window-size=1280,1400"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]
        self.shots = tmp / "screenshots"
        self.shots.mkdir(exist_ok=True)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/status", timeout=2) as r:
                return json.load(r)["value"]["ready"]
        except OSError:
            return False

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.load(r)["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.read().decode()[:500]}") from None

    def _s(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self._s("POST", "/url", {"url": url})

    def find(self, css: str) -> str:
        return self._s("POST", "/element", {"using": "css selector", "value": css})[self.ELEMENT]

    def click(self, css: str) -> None:
        self._s("POST", f"/element/{self.find(css)}/click", {})

    def follow(self, css: str) -> None:
        """Click a link or submit button, and wait for the next page: a
        form's navigation may start after the click has returned."""
        old = self.find("html")
        self.click(css)
        until(lambda: self._stale(old), f"a new page after clicking {css}")

    def _stale(self, element: str) -> bool:
        try:
            self._s("GET", f"/element/{element}/name")
            return False
        except AssertionError as e:
            return "stale element" in str(e)

    def type(self, css: str, text: str) -> None:
        el = self.find(css)
        self._s("POST", f"/element/{el}/clear", {})
        self._s("POST", f"/element/{el}/value", {"text": text})

    def text(self, css: str = "main") -> str:
        return re.sub(r"\s+", " ", self._s("GET", f"/element/{self.find(css)}/text"))

    def title(self) -> str:
        return self._s("GET", "/title")

    def screenshot(self, name: str) -> None:
        png = base64.b64decode(self._s("GET", "/screenshot"))
        (self.shots / f"{name}.png").write_bytes(png)

    def quit(self) -> None:
        try:
            self._s("DELETE", "")
        finally:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def browser(env):
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): "
                    f"apt-get install chromium chromium-driver (CI installs them)")
    b = Browser(env.tmp)
    yield b
    b.quit()


def test_browser_cluster_and_broker_pages(env, browser):
    def charted():
        browser.open(env.url + "/")
        return "put TPS" in browser.text()
    until(charted, "the chart's legend in the browser")
    assert browser.title() == "Cluster - shmq console"
    assert f"DefaultCluster broker-a 0 {env.broker.addr} V4_9_7" in browser.text()
    browser.screenshot("01-cluster")
    browser.follow('a[href^="/broker?addr="]')
    assert f"Broker {env.broker.addr}" in browser.text() and "commitLogDiskRatio" in browser.text()
    browser.screenshot("02-broker")


def test_browser_topic_create_send_delete(env, browser):
    browser.open(env.url + "/topics")
    browser.type('form[action="/topic/create"] input[name=topic]', "ConsoleBrowserT")
    browser.type('form[action="/topic/create"] input[name=writeQueueNums]', "2")
    browser.type('form[action="/topic/create"] input[name=readQueueNums]', "2")
    browser.follow('form[action="/topic/create"] button')
    assert "Topic ConsoleBrowserT created on" in browser.text(".notice")
    browser.screenshot("03-topics-created")

    def routed():
        browser.open(env.url + "/topic?topic=ConsoleBrowserT")
        return "Route" in browser.text()
    until(routed, "ConsoleBrowserT routed")
    browser.type('form[action="/topic/send"] input[name=body]', "typed in a browser")
    browser.type('form[action="/topic/send"] input[name=key]', "browser-key")
    browser.follow('form[action="/topic/send"] button')
    assert "(SEND_OK) to broker-a" in browser.text(".notice")
    assert re.search(r"broker-a \d 0 1 \d{4}-", browser.text()), browser.text()
    browser.screenshot("04-topic-sent")
    browser.follow('form[action="/topic/delete"] button')                 # not ticked: refused
    assert "tick 'yes, delete ConsoleBrowserT'" in browser.text(".error")
    assert browser.title() == "Topic ConsoleBrowserT - shmq console"      # the form's page again
    browser.screenshot("05-topic-delete-refused")
    browser.click('form[action="/topic/delete"] input[name=confirm]')
    browser.follow('form[action="/topic/delete"] button')
    assert "Topic ConsoleBrowserT deleted" in browser.text(".notice")
    browser.screenshot("06-topic-deleted")


def test_browser_messages_queries_and_message_page(env, browser):
    r = env.sent["order-1"]
    browser.open(env.url + "/messages")
    browser.type("main form:nth-of-type(1) input[name=topic]", TOPIC)
    browser.type("main form:nth-of-type(1) input[name=msgKey]", "order-1")
    browser.follow("main form:nth-of-type(1) button")
    assert "1 message(s)" in browser.text() and r.msg_id in browser.text()
    browser.screenshot("07-messages-by-key")
    browser.open(env.url + "/messages")
    browser.type("main form:nth-of-type(2) input[name=msgId]", r.offset_msg_id)
    browser.follow("main form:nth-of-type(2) button")
    assert "1 message(s)" in browser.text() and "order-1" in browser.text()
    browser.open(env.url + "/messages")
    browser.type("main form:nth-of-type(3) input[name=topic]", TOPIC)
    browser.type("main form:nth-of-type(3) input[name=beginTimestamp]", "0")
    browser.follow("main form:nth-of-type(3) button")
    assert "3 message(s)" in browser.text()
    browser.screenshot("08-messages-by-time")
    browser.follow(f'a[href="/message?msgId={r.offset_msg_id}"]')
    text = browser.text()
    assert "body of order-1 <b>" in text and f"UNIQ_KEY {r.msg_id}" in text and " Pub " in text
    browser.screenshot("09-message-with-trace")


def test_browser_consumer_group_reset_and_skip(env, browser):
    browser.open(env.url + "/groups")
    browser.follow(f'a[href="/group?group={GROUP}"]')
    assert f"Consumer group {GROUP}" in browser.text() and "Lag per queue" in browser.text()
    browser.screenshot("10-group")
    browser.type('form[action="/group/reset"] input[name=timestamp]', "now")
    browser.follow('form[action="/group/reset"] button')
    assert "reset to now: sent to its consumers" in browser.text(".notice")
    browser.follow('form[action="/group/skip"] button')
    assert f"Backlog of {GROUP} in {TOPIC} skipped" in browser.text(".notice")
    browser.screenshot("11-group-skipped")


def test_browser_producers(env, browser):
    browser.open(env.url + "/producers")
    browser.type("input[name=producerGroup]", PGROUP)
    browser.type("input[name=topic]", TOPIC)
    browser.follow("main form button")
    assert env.producer._p.instance.client_id in browser.text("table")
    browser.screenshot("12-producers")


def test_browser_dead_letter_resend(env, browser):
    dlq = dead_letter_id(env, "dead-2")
    before = len([m for m in env.consumed if m.keys == "dead-2"])
    browser.open(env.url + "/message?msgId=" + dlq)
    assert f"Resend to consumer group {GROUP}" in browser.text()
    browser.follow('form[action="/message/resend"] button')
    assert f"Resent to %RETRY%{GROUP}" in browser.text(".notice")
    browser.screenshot("13-dead-letter-resent")
    until(lambda: [m for m in env.consumed if m.keys == "dead-2"][before:], "dead-2 again")


def test_browser_bad_input(env, browser):
    browser.open(env.url + "/topic?topic=NoSuchTopic")
    assert "topic NoSuchTopic does not exist" in browser.text(".error")
    browser.screenshot("14-unknown-topic")
    browser.open(env.url + "/messages")
    browser.type("main form:nth-of-type(3) input[name=topic]", TOPIC)
    browser.type("main form:nth-of-type(3) input[name=beginTimestamp]", "yesterday")
    browser.follow("main form:nth-of-type(3) button")
    assert "From (beginTimestamp): 'yesterday': want milliseconds" in browser.text(".error")
    assert browser.find("main form:nth-of-type(3) button")           # the forms stay
    browser.screenshot("15-bad-time")
