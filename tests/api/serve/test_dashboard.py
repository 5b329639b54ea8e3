"""The dashboard in a real headless Chromium: a watch added through the page shows its verdicts
and its alerts. Set VIDSIGHT_DASHBOARD_SHOT=PATH to keep a screenshot."""

import os
import shutil

import pytest

from tests.api.serve.conftest import QUERY

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver")),
                                 reason="needs Debian's chromium and chromium-driver")]
webdriver = pytest.importorskip("selenium.webdriver")


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1100,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def test_a_watch_added_on_the_page_shows_verdicts_and_alerts(make_local_server, media, make_test_video, browser,
                                                             monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from vidsight.engine.watch import Watcher

    judging = Watcher.judging

    def some_windows_yes(self, frames, number=0):   # the random model never says Yes
        verdict = yield from judging(self, frames, number)
        verdict.yes = number % 6 in (2, 3)
        verdict.p_yes = 0.9 if verdict.yes else verdict.p_yes
        return verdict

    monkeypatch.setattr(Watcher, "judging", some_windows_yes)
    path, _ = make_test_video(width=160, height=120, fps=8, duration_s=16.0, gop=16, bframes=False, seed=9)
    (media / "yard.mp4").write_bytes(path.read_bytes())
    with make_local_server() as (url, server):
        browser.get(url + "/")
        form = browser.find_element(By.ID, "add-watch")
        form.find_element(By.NAME, "source").send_keys("yard.mp4")
        for name, value in (("query", QUERY), ("window_s", "4"), ("stride", "0.25"), ("alert_after", "1")):
            field = form.find_element(By.NAME, name)
            field.clear()
            field.send_keys(value)
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "finished" in b.find_element(By.CSS_SELECTOR, ".watch-box .meta").text)
        alerts = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".watch-box .alert")]
        watch = server.store.watches()[0]
        stored = server.store.events(watch["id"])
        windows = [e for e in stored if e["event"] == "window"]
        assert len(windows) >= 10
        drawn = browser.execute_script("return document.querySelector('.watch-box').windows.length")
        assert drawn == len(windows)
        assert len(alerts) == sum(e["event"] == "alert" for e in stored) >= 2
        assert all(a.startswith("ALERT") and QUERY in a for a in alerts)
        last = windows[-1]["data"]
        lag = browser.find_element(By.CSS_SELECTOR, ".watch-box .lag").text
        assert lag.startswith(f"latest window {last['start_s']:.1f}–{last['end_s']:.1f} s, judged ") and "skipped" not in lag
        wait.until(lambda b: b.execute_script("return document.querySelector('.watch-box img').naturalWidth") > 0)
        if os.environ.get("VIDSIGHT_DASHBOARD_SHOT"):
            browser.save_screenshot(os.environ["VIDSIGHT_DASHBOARD_SHOT"])
