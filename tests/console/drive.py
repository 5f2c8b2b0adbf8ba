"""Drives the operator console (GET / of `tidings serve`) in headless Chromium.

usage: drive.py BASE_URL OPERATOR_KEY TENANT_KEY DEAD_QUEUE SEGMENT SCREENSHOT_DIR [STATUS=NOTIFICATION_ID...]

Opens the console as the link `tidings serve` prints it (the keys in the URL's fragment) and
checks each view against a running system that `tests/e2e/console.rs` prepared: the
notifications list with a campaign's progress bar moving (the campaign is started here, to a
slowed provider, so the bar is seen below 100% and then higher), each STATUS=ID notification
shown in its outcome's colour (amber, red, and the campaign green), the charts of sends, queue
depths and ages, the dead letters with their reasons and a redrive by click after the
confirmation dialog (dismissed first: nothing moves), a user's inbox, deliveries and
preferences, a SKU's stock and ledger, and the restock notices needing attention with a resend
by click. Saves a screenshot of each view in SCREENSHOT_DIR. Exits non-zero with a message on
the first thing that is not as expected; prints `resent BATCH` and `campaign ID` for the test.
"""

import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chromium  # noqa: E402  (tests/chromium.py)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait


def fail(what):
    raise SystemExit(f"console check failed: {what}")


def wait_for(what, check, timeout=60.0):
    return chromium.wait_for(what, check, timeout, 0.2, fail)


class Console:
    def __init__(self, driver, base, key, tenant_key, shots):
        self.driver, self.base, self.key, self.tenant_key, self.shots = driver, base, key, tenant_key, shots

    def call(self, method, path, body=None, as_tenant=False):
        """The API, beside the page (what a shop's systems would do meanwhile)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + (self.tenant_key if as_tenant else self.key))
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as res:
            return json.loads(res.read() or b"null")

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def rows(self, table):
        """A table's rows, each {data: dataset, cells: [text]}, read in one script call: the
        page re-renders every two seconds, and a re-render cannot fall inside one call."""
        return self.js(
            "return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)].map(tr => ({"
            "data: {...tr.dataset}, cells: [...tr.querySelectorAll('td')].map(td => td.textContent)}));", table)

    def text(self, element_id):
        return self.driver.find_element(By.ID, element_id).text

    def view(self, name):
        self.driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-view="{name}"]').click()
        wait_for(f"the {name} view to show", lambda: self.js("return document.body.dataset.view") == name)

    def screenshot(self, name):
        path = os.path.join(self.shots, f"{name}.png")
        self.js("window.scrollTo(0, 0)")
        if not self.driver.save_screenshot(path):
            raise SystemExit(f"console check failed: no screenshot {path}")
        print(f"screenshot {path}")

    def click_confirmed(self, selector, accept):
        """Clicks a button (found afresh: the table is re-rendered) and answers its dialog."""
        def click():
            button = self.driver.find_element(By.CSS_SELECTOR, selector)
            if not button.is_enabled():
                return False
            button.click()
            return True
        wait_for(f"clicking {selector}", click)
        alert = WebDriverWait(self.driver, 10).until(expected_conditions.alert_is_present())
        asked = alert.text
        if accept:
            alert.accept()
        else:
            alert.dismiss()
        return asked


def keys_from_the_link(c):
    c.driver.get(f"{c.base}/#key={c.key}&tenant_key={c.tenant_key}")
    wait_for("the page to refresh once", lambda: c.js("return document.body.dataset.refreshed"))
    url = c.driver.current_url
    if "#" in url or c.key in url:
        raise SystemExit(f"console check failed: the keys stay in the address bar: {url}")
    stored = c.js("return [sessionStorage.getItem('tidings.key'), sessionStorage.getItem('tidings.tenant_key')]")
    if stored != [c.key, c.tenant_key]:
        raise SystemExit(f"console check failed: the keys are not in session storage: {stored}")


def campaign_bar_moves(c, segment):
    c.view("notifications")
    wait_for("the notifications list", lambda: c.rows("notifications") and c.rows("notifications")[0]["data"].get("id"))
    c.call("PUT", "/dev/providers/email", {"mode": "ok", "delay_ms": 2000})
    accepted = c.call("POST", "/v1/notifications", {
        "idempotency_key": "console-campaign", "recipients": {"segment": segment}, "template_id": "promo",
        "category": "marketing", "channels": ["email"]}, as_tenant=True)
    campaign = accepted["notification_id"]

    def bar():
        for r in c.rows("notifications"):
            if r["data"].get("id") == campaign:
                return c.js("return Number(document.querySelector(`#notifications tr[data-id='${arguments[0]}'] [data-pct]`)"
                            ".dataset.pct)", campaign)
        return None
    first = wait_for("the campaign's bar below 100%", lambda: (lambda p: p is not None and p < 100 and (p,))(bar()))[0]
    later = wait_for(f"the campaign's bar past {first}%", lambda: (lambda p: p is not None and p > first and (p,))(bar()),
                     timeout=120)[0]
    if later < 100:
        c.screenshot("notifications")  # the bar part-way
    c.call("PUT", "/dev/providers/email", {"mode": "ok"})
    wait_for("the campaign's bar at 100%", lambda: bar() == 100, timeout=180)
    if later == 100:
        c.screenshot("notifications")
    print(f"campaign {campaign}: its bar went from {first}% to {later}%, then 100%")
    return campaign


def outcomes_coloured(c, outcomes):
    """Each ended notification's status and bar show how it ended: `completed_with_failures`
    amber, `failed` red, `completed` green."""
    c.view("notifications")
    want = {"completed": ("outcome-completed", "done"), "completed_with_failures": ("outcome-partial", "partial"),
            "failed": ("outcome-failed", "failed")}

    def shown(nid):
        return c.js("const tr = document.querySelector(`#notifications tr[data-id='${arguments[0]}']`);"
                    "if (!tr) return null;"
                    "const b = tr.querySelector('.bar'), s = tr.querySelectorAll('td')[4];"
                    "return [tr.dataset.status, s.className, [...b.classList], getComputedStyle(b.firstChild).backgroundColor];",
                    nid)
    colours = {}
    for status, nid in outcomes:
        cls, bar_cls = want[status]
        got = wait_for(f"{nid} shown {status}", lambda: (lambda v: v and v[0] == status and v)(shown(nid)))
        if got[1] != cls or bar_cls not in got[2]:
            raise SystemExit(f"console check failed: {status} {nid} shows status class {got[1]!r}, bar {got[2]}")
        colours[status] = got[3]
    if len(set(colours.values())) != len(colours):
        raise SystemExit(f"console check failed: two outcomes share a colour: {colours}")
    c.screenshot("outcomes")
    print(f"outcomes: {colours}")


def workflow_runs_shown(c):
    """A workflow send's runs: one per recipient, where it waits and until when, or how it ended
    and why (docs/workflows.md, "Runs")."""
    c.view("notifications")
    c.call("PUT", "/v1/templates/wf_note", {"default_locale": "en", "locales": {"en": {
        "email_subject": "A note", "email_body": "A note for you"}}}, as_tenant=True)
    for u in ["wf-a", "wf-b"]:
        c.call("PUT", f"/v1/users/{u}", {"email": f"{u}@example.com"}, as_tenant=True)
    c.call("PUT", "/v1/workflows/nudge", {"name": "Nudge", "category": "transactional", "steps": [
        {"type": "throttle", "limit": 1, "per": "1d"},
        {"type": "send", "channel": "email", "template_id": "wf_note"},
        {"type": "delay", "for": "1h"},
        {"type": "send", "channel": "email", "template_id": "wf_note", "if": {"step": 1, "is": "not_opened"}}]},
        as_tenant=True)
    # wf-b passes the throttle once here; the next send finds it full. The next is sent once
    # this run is past the throttle: the two runs would otherwise race for it on the lanes.
    first = c.call("POST", "/v1/notifications", {"recipients": {"user_ids": ["wf-b"]}, "workflow_id": "nudge"},
                   as_tenant=True)["notification_id"]

    def past_the_throttle():
        items = c.call("GET", f"/v1/notifications/{first}/runs", as_tenant=True).get("items", [])
        return any(r.get("user_id") == "wf-b" and r.get("status") in ("waiting", "completed") for r in items)
    wait_for("wf-b's first run past the throttle", past_the_throttle)
    nid = c.call("POST", "/v1/notifications", {"recipients": {"user_ids": ["wf-a", "wf-b"]}, "workflow_id": "nudge"},
                 as_tenant=True)["notification_id"]
    link = f"#notifications button[data-notification='{nid}']"

    def click():
        found = c.driver.find_elements(By.CSS_SELECTOR, link)
        if not found:
            return False
        found[0].click()
        return True
    wait_for("the workflow send in the list", click)

    def runs():
        rows = {r["data"].get("user"): r["cells"] for r in c.rows("notification-runs") if r["data"].get("user")}
        a, b = rows.get("wf-a"), rows.get("wf-b")
        return a and b and a[1] == "waiting" and b[1] == "throttled" and (a, b)
    a, b = wait_for("wf-a waiting at the delay, wf-b throttled", runs)
    if a[2] != "2 delay" or not a[3]:
        raise SystemExit(f"console check failed: the waiting run shows {a}")
    if b[4] != "throttled":
        raise SystemExit(f"console check failed: the throttled run says why as {b[4]!r}")
    c.screenshot("runs")
    print(f"runs of {nid}: wf-a waits at {a[2]} until {a[3]}; wf-b ended throttled")


def charts_plot(c):
    c.view("rates")

    def plotted():
        state = c.js("return ['chart-sends', 'chart-depth', 'chart-age'].map(id => {"
                     "const el = document.getElementById(id);"
                     "return [Number(el.dataset.points || 0), el.dataset.series || '', !!el.querySelector('canvas')]; });")
        return all(points >= 3 and canvas for points, _, canvas in state) and "email" in state[0][1].split(",") and state
    state = wait_for("three charts with samples, email among the channels", plotted)
    wait_for("the channel figures", lambda: any(r["cells"][0] == "email" for r in c.rows("channel-figures")))
    if c.text("rates-error"):
        raise SystemExit(f"console check failed: the rates view shows an error: {c.text('rates-error')}")
    c.screenshot("rates")
    print(f"charts {state}")


def dead_letter_redriven(c, dead_queue):
    c.view("dead")

    def dlq(n):
        return lambda: any(r["data"].get("queue") == dead_queue and r["data"].get("dlq") == str(n) for r in c.rows("queues"))
    wait_for(f"{dead_queue} shows one dead letter", dlq(1))
    reason = wait_for(f"the reason of {dead_queue}'s dead letter",
                      lambda: next((r["cells"][6] for r in c.rows("dead-letters") if r["data"].get("queue") == dead_queue), None))
    if "503" not in reason or "alice" not in reason:
        raise SystemExit(f"console check failed: the dead letter's reason names neither the user nor the error: {reason}")
    c.screenshot("dead-letters")
    selector = f'#queues button[data-queue="{dead_queue}"]'
    # Dismissed: nothing moves.
    asked = c.click_confirmed(selector, accept=False)
    if dead_queue not in asked:
        raise SystemExit(f"console check failed: the confirmation does not name the queue: {asked!r}")
    time.sleep(2.5)
    if not dlq(1)() or c.text("redrive-result"):
        raise SystemExit("console check failed: a dismissed redrive moved something or said it did")
    c.click_confirmed(selector, accept=True)
    wait_for("the redrive's result", lambda: "moved 1 message" in c.text("redrive-result"))
    wait_for(f"{dead_queue}'s DLQ empties after the redrive click", dlq(0))
    print(f"redrive: {c.text('redrive-result')}")


def user_views(c):
    c.view("user")
    box = c.driver.find_element(By.ID, "user-id")
    # An error is shown, not swallowed: a user id the API refuses.
    box.clear()
    box.send_keys("u#1\n")
    wait_for("the refused user id's problem", lambda: "422" in c.text("user-error"))
    box.clear()
    box.send_keys("alice\n")
    wait_for("alice's inbox shows her message", lambda: "Welcome aboard" in c.text("inbox"))
    wait_for("the unread count", lambda: "unread: 1" in c.text("inbox-unread"))
    wait_for("alice's profile", lambda: "alice@example.com" in c.text("user-profile"))
    wait_for("alice's preferences", lambda: len(c.rows("user-preferences")) >= 1 and not c.text("user-error"))
    wait_for("alice's deliveries", lambda: "alice@example.com" in c.text("user-deliveries"))
    c.screenshot("user")


def stock_views(c):
    c.view("stock")
    box = c.driver.find_element(By.ID, "sku")
    box.clear()
    box.send_keys("A\n")
    wait_for("the stock of A", lambda: "available" in c.text("stock"))
    wait_for("A's ledger", lambda: any(r["cells"][1] for r in c.rows("ledger") if len(r["cells"]) > 1))
    c.screenshot("stock")


def restock_resent(c):
    c.view("restock")
    batch = wait_for("a notice needing attention",
                     lambda: next((r["data"]["batch"] for r in c.rows("restock") if r["data"].get("batch")), None))
    c.screenshot("restock")
    asked = c.click_confirmed(f'#restock button[data-batch="{batch}"]', accept=True)
    if batch not in asked:
        raise SystemExit(f"console check failed: the confirmation does not name the batch: {asked!r}")
    wait_for("the resend's result", lambda: "1 notice(s) resent" in c.text("resend-result"))
    print(f"resent {batch}")


def main():
    base, key, tenant_key, dead_queue, segment, shots = sys.argv[1:7]
    # The notifications that ended each way: `status=id` pairs.
    outcomes = [tuple(a.split("=", 1)) for a in sys.argv[7:]]
    os.makedirs(shots, exist_ok=True)
    driver = chromium.start(1400, 1000)
    try:
        c = Console(driver, base, key, tenant_key, shots)
        keys_from_the_link(c)
        campaign = campaign_bar_moves(c, segment)
        outcomes_coloured(c, outcomes + [("completed", campaign)])
        workflow_runs_shown(c)
        charts_plot(c)
        dead_letter_redriven(c, dead_queue)
        user_views(c)
        stock_views(c)
        restock_resent(c)
        print(f"campaign {campaign}")
        print(f"console OK; screenshots in {shots}")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
