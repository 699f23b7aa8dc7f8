"""spe app served: through Gradio's Python client, and in a real headless Chromium (upload a prompt,
generate, the audio element plays a non-silent source, the MIDI downloads)."""

import shutil
import signal
import urllib.request
from pathlib import Path

import pytest
from symusic import Score

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def test_the_page_answers_gradios_client(served, music_run, prompt, tmp_path, generation, wav_peak):
    from gradio_client import Client, handle_file

    client = Client(served, download_files=str(tmp_path), verbose=False)
    roll, audio, midi, message = client.predict(str(music_run), "an uploaded MIDI file", handle_file(str(prompt)), 0, 2,
                                                *generation.values(), api_name="/generate")
    assert "64 generated" in message and "Error" not in message and "leaves out" not in message
    assert Path(roll).read_bytes()[:4] == b"\x89PNG"
    assert wav_peak(Path(audio).read_bytes()) > 1000
    assert sum(len(t.notes) for t in Score(midi).tracks) > 0
    plot, numbers = client.predict(str(music_run), api_name="/results")
    assert Path(plot).read_bytes()[:4] == b"\x89PNG" and "within training length" in numbers
    bad = tmp_path / "bad.mid"
    bad.write_text("not music")
    *outputs, message = client.predict(str(music_run), "an uploaded MIDI file", handle_file(str(bad)), 0, 2,
                                       *generation.values(), api_name="/generate")
    assert outputs == [None, None, None] and message.startswith("**Error:**") and "bad.mid" in message


# In the page: every media element (Gradio's player keeps its own in a shadow root) with its
# source, then the first one with a source fetched, decoded and its peak sample measured.
_AUDIO_PEAK = """
const done = arguments[arguments.length - 1];
const media = [];
const walk = root => root.querySelectorAll('*').forEach(e => {
  if (e.shadowRoot) walk(e.shadowRoot);
  if (e instanceof HTMLAudioElement && e.currentSrc) media.push(e);
});
walk(document);
if (!media.length) { done({error: 'no audio element with a source'}); return; }
const audio = media[0];
fetch(audio.currentSrc).then(r => r.arrayBuffer())
  .then(bytes => new OfflineAudioContext(2, 22050, 22050).decodeAudioData(bytes))
  .then(buffer => {
    let peak = 0;
    for (let c = 0; c < buffer.numberOfChannels; c++)
      for (const x of buffer.getChannelData(c)) peak = Math.max(peak, Math.abs(x));
    audio.muted = true;
    return audio.play().then(() => new Promise(r => setTimeout(r, 700)))
      .then(() => done({peak: peak, seconds: buffer.duration, played: audio.currentTime}));
  }).catch(err => done({error: String(err)}));
"""


def test_a_term_signal_stops_the_app_and_removes_its_files(serve_app, tmp_path):
    # SIGTERM (a service manager's stop) once killed the process at once: atexit never ran and the
    # generated files stayed; the app now stops as on Ctrl-C (serve_app asserts both).
    with serve_app(tmp_path, signal.SIGTERM) as url:
        assert urllib.request.urlopen(url, timeout=10).status == 200
        assert list((tmp_path / "tmp").glob("spe-app-*")), "the app's folder exists while it serves"


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no chromium and chromedriver on PATH (Debian: apt-get "
                    "install chromium chromium-driver; .ci/run installs them)")
def test_in_a_browser_a_prompt_becomes_music_to_hear_and_download(served, prompt, tmp_path, generation):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1300",
                     "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(argument)
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        browser.get(served)
        WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.ID, "generate"))
        browser.find_element(By.XPATH, "//label[.//span[text()='an uploaded MIDI file']]").click()
        browser.find_element(By.CSS_SELECTOR, "#prompt-file input[type=file]").send_keys(str(prompt))
        WebDriverWait(browser, 30).until(lambda b: "piece0" in b.find_element(By.ID, "prompt-file").text)
        for name in ("length (tokens)", "top-p", "temperature"):
            field = browser.find_element(By.CSS_SELECTOR, f"input[aria-label='number input for {name}']")
            field.clear()
            field.send_keys(str(generation[name.split()[0].replace("-", "_")]), Keys.TAB)
        browser.find_element(By.ID, "generate").click()
        WebDriverWait(browser, 60).until(lambda b: "generated" in b.find_element(By.ID, "message").text
                                         or "Error" in b.find_element(By.ID, "message").text)
        assert "64 generated" in browser.find_element(By.ID, "message").text
        browser.set_script_timeout(30)
        heard = browser.execute_async_script(_AUDIO_PEAK)
        browser.save_screenshot(str(tmp_path / "spe-app.png"))
        assert "error" not in heard, heard
        assert heard["peak"] > 0.01 and heard["seconds"] > 1 and heard["played"] > 0
        link = browser.find_element(By.CSS_SELECTOR, "#midi a[download]")
        assert link.get_attribute("download").endswith(".mid")
        midi = tmp_path / "downloaded.mid"
        midi.write_bytes(urllib.request.urlopen(link.get_attribute("href"), timeout=10).read())
        assert sum(len(t.notes) for t in Score(str(midi)).tracks) > 0
    finally:
        browser.quit()
    assert (tmp_path / "spe-app.png").read_bytes()[:4] == b"\x89PNG"
