"""Drives the local console (GET / of `tidings serve`) in headless Chromium.

usage: drive.py BASE_URL OPERATOR_KEY TENANT_KEY DEAD_QUEUE

Checks what the console shows of a running system (queues with a dead letter, the recent
deliveries, a user's inbox) and that its redrive button moves the dead letter back. Exits
non-zero with a message on the first thing that is not as expected.
"""

import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def wait_for(what, check, timeout=60.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # the page may be mid-refresh
            last = e
        time.sleep(0.2)
    raise SystemExit(f"console check failed: {what} (last error: {last})")


def main():
    base, key, tenant_key, dead_queue = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    options = Options()
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]:
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"{base}/#key={key}&tenant_key={tenant_key}")
        # Queues: the dead letter is shown, with an enabled redrive button. The table is
        # re-rendered every two seconds: it is read in one script call, so a re-render cannot
        # fall between reading its rows and their cells (on a loaded machine it always did).
        def queue_rows():
            return driver.execute_script(
                "return [...document.querySelectorAll('#queues tbody tr')]"
                ".map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent));")

        def dead_row():
            for cells in queue_rows():
                if cells and cells[0] == dead_queue:
                    return cells if cells[4] == "1" else None
            return None
        wait_for(f"{dead_queue} shows one dead letter", dead_row)
        # Recent deliveries and the inbox.
        wait_for("the recent deliveries list the accepted email",
                 lambda: "alice@example.com" in driver.find_element(By.ID, "deliveries").text)
        user = driver.find_element(By.ID, "inbox-user")
        user.clear()
        user.send_keys("alice\n")
        wait_for("alice's inbox shows her message",
                 lambda: "Welcome aboard" in driver.find_element(By.ID, "inbox").text)
        wait_for("the unread count", lambda: "unread: 1" in driver.find_element(By.ID, "inbox-unread").text)
        # Redrive from the browser: the dead letter goes back and the DLQ empties.
        # The table is re-rendered every two seconds: find the button afresh for the click.
        def click_redrive():
            button = driver.find_element(By.CSS_SELECTOR, f'button[data-queue="{dead_queue}"]')
            if not button.is_enabled():
                return False
            button.click()
            return True
        wait_for("clicking the redrive button", click_redrive)
        wait_for(f"{dead_queue}'s DLQ empties after the redrive click",
                 lambda: any(c and c[0] == dead_queue and c[4] == "0" for c in queue_rows()))
        print("console OK")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
