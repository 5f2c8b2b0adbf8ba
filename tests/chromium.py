"""Headless Chromium for the browser tests (tests/console/drive.py, tests/site/drive.py).

Debian's `chromium` and `chromium-driver` packages, driven through Selenium; each driver adds
itself to `sys.path` and imports this module.
"""

import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def start(width, height):
    """A headless Chromium window of that size (quit it when done)."""
    options = Options()
    for flag in FLAGS + [f"--window-size={width},{height}"]:
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(30)
    return driver


def wait_for(what, check, timeout, every, fail):
    """`check()`'s first true value within `timeout` seconds, tried every `every` seconds (an
    exception counts as not yet: the page may be mid-load); else `fail(what and the last error)`."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:
            last = e
        time.sleep(every)
    return fail(f"{what} (last error: {last})")
