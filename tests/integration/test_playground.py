"""The web playground (GET / of --http_listen) in a real browser: Debian's chromium, headless,
driven by chromium-driver through python3-selenium, against a real txl-server on the bundled model.

The test loads the page, creates a session, types a prompt and generates; waits for streamed text;
continues the same session and checks the position the page shows against GET /v1/sessions/{id};
undoes the second turn and retries the first (both rewind the session); forks and deletes. It saves a screenshot (--screenshot) as the test's artefact. A second test holds a generation to a JSON schema from the output box, and
shows the server's refusals of the others.

Run by CTest: /usr/bin/python3 test_playground.py --bin-dir BUILD --stubs BUILD/client/python/gen
              --model MODEL --screenshot BUILD/tests/playground.png
"""
import json
import os
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


class PlaygroundTest(unittest.TestCase):
    def setUp(self):
        self.server = txl_procs.Server(ARGS.bin_dir, ARGS.model, http=True)
        self.base = "http://" + self.server.http_address
        options = webdriver.ChromeOptions()
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1200,900"):
            options.add_argument(flag)
        options.binary_location = "/usr/bin/chromium"
        self.browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        self.wait = WebDriverWait(self.browser, 60)

    def tearDown(self):
        self.browser.quit()
        self.assertEqual(self.server.stop(), 0)

    def session(self, sid):
        with urllib.request.urlopen("%s/v1/sessions/%s" % (self.base, sid)) as r:
            return json.load(r)

    def text(self, element_id):
        return self.browser.find_element(By.ID, element_id).text

    def generate(self, prompt, max_tokens):
        box = self.browser.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(prompt)
        limit = self.browser.find_element(By.ID, "max_tokens")
        limit.clear()
        limit.send_keys(str(max_tokens))
        before = self.text("output")
        self.browser.find_element(By.ID, "generate").click()
        # Streamed text appears (beyond the echoed prompt), then the page reports the end.
        self.wait.until(lambda b: len(self.text("output")) > len(before) + len(prompt))
        self.wait.until(lambda b: self.text("status").startswith("done"))
        self.assertEqual(self.text("status"), "done: %d tokens" % max_tokens)

    def test_create_generate_continue_fork_delete(self):
        self.browser.get(self.base + "/")
        self.assertEqual(self.browser.title, "txl-serve playground")
        self.wait.until(lambda b: self.text("model").startswith("shakespeare_char"))
        self.browser.find_element(By.ID, "new").click()
        self.wait.until(lambda b: self.text("session") != "none")
        sid = self.text("session")
        self.assertEqual(self.session(sid)["position"], 0)

        self.generate("ROMEO:", 24)
        # Every generated token is its own shaded span, titled with its log-prob.
        spans = self.browser.find_elements(By.CSS_SELECTOR, "#output span.tok")
        self.assertEqual(len(spans), 24)
        self.assertTrue(all(s.get_attribute("title").startswith("log p = ") for s in spans))
        # The session's position counts the prompt and every generated token.
        shown = int(self.text("position"))
        self.assertEqual(shown, self.session(sid)["position"])
        self.assertEqual(shown, len("ROMEO:") + 24)

        self.generate(" And then", 16)
        shown2 = int(self.text("position"))
        self.assertEqual(shown2, self.session(sid)["position"])
        self.assertEqual(shown2, shown + len(" And then") + 16)
        self.assertIn("positions", self.text("memory"))

        self.browser.save_screenshot(ARGS.screenshot)

        # Undo takes the second turn back (the session rewinds); its text returns to the box.
        self.browser.find_element(By.ID, "undo").click()
        self.wait.until(lambda b: self.text("status").startswith("undone"))
        self.assertEqual(self.session(sid)["position"], shown)
        self.assertEqual(int(self.text("position")), shown)
        self.assertEqual(self.browser.find_element(By.ID, "prompt").get_attribute("value"), " And then")
        self.assertEqual(len(self.browser.find_elements(By.CSS_SELECTOR, "#output span.tok")), 24)
        # Retry: a new reply to the first prompt replaces the old one (with the sampling fields as they are).
        limit = self.browser.find_element(By.ID, "max_tokens")
        limit.clear()
        limit.send_keys("24")
        self.browser.find_element(By.ID, "retry").click()
        self.wait.until(lambda b: self.text("status").startswith("done"))
        self.assertEqual(self.text("status"), "done: 24 tokens")
        self.assertEqual(self.session(sid)["position"], shown)
        self.assertEqual(int(self.text("position")), shown)
        self.assertEqual(len(self.browser.find_elements(By.CSS_SELECTOR, "#output span.tok")), 24)
        self.assertTrue(self.text("output").startswith("ROMEO:"))
        shown2 = shown

        self.browser.find_element(By.ID, "fork").click()
        self.wait.until(lambda b: self.text("session") not in ("none", sid))
        fork = self.text("session")
        self.assertEqual(self.session(fork)["position"], shown2)
        self.browser.find_element(By.ID, "delete").click()
        self.wait.until(lambda b: self.text("session") == "none")
        with self.assertRaises(urllib.error.HTTPError) as gone:
            self.session(fork)
        self.assertEqual(gone.exception.code, 404)
        self.assertEqual(self.session(sid)["position"], shown2)  # the source is untouched

    def choose_format(self, value, schema=None):
        from selenium.webdriver.support.ui import Select
        Select(self.browser.find_element(By.ID, "format")).select_by_value(value)
        box = self.browser.find_element(By.ID, "schema")
        self.assertEqual(box.is_displayed(), value == "json_schema")
        if schema is not None:
            box.clear()
            box.send_keys(schema)

    def submit(self, prompt):
        box = self.browser.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(prompt)
        self.browser.find_element(By.ID, "generate").click()

    def test_the_output_box_holds_the_text_to_a_json_schema(self):
        self.browser.get(self.base + "/")
        self.wait.until(lambda b: self.text("model").startswith("shakespeare_char"))
        limit = self.browser.find_element(By.ID, "max_tokens")
        limit.clear()
        limit.send_keys("8")
        # Greedy, so that the text is one answer: an integer may also start with "-", and at the
        # page's temperature of 0.8 the model draws "-3" (two tokens) after "ROMEO:" in about 1.7%
        # of runs (log p of "-" -11.67, of "3" -8.43), which failed this test now and then.
        temperature = self.browser.find_element(By.ID, "temperature")
        temperature.clear()
        temperature.send_keys("0")
        # The bundled model's one digit is 3: an integer is "3", and a whole root ends the text.
        self.choose_format("json_schema", '{"type": "integer"}')
        self.submit("ROMEO:")
        self.wait.until(lambda b: self.text("status").startswith("done"))
        self.assertEqual(self.text("status"), "done: 1 tokens (stop)")
        self.assertEqual(self.text("output"), "ROMEO:3")
        # The server's refusals reach the status line, naming what is wrong; nothing is generated.
        self.choose_format("json_schema", '{"type": "integer", "minimum": 1}')
        self.submit("ROMEO:")
        self.wait.until(lambda b: "minimum" in self.text("status"))
        self.assertIn("'minimum' is not supported", self.text("status"))
        # A refused call fed nothing: its prompt goes back to the box, and the output is as it was.
        self.assertEqual(self.browser.find_element(By.ID, "prompt").get_attribute("value"), "ROMEO:")
        self.assertEqual(self.text("output"), "ROMEO:3")
        self.choose_format("json_object")
        self.submit("ROMEO:")
        self.wait.until(lambda b: "vocabulary" in self.text("status"))
        self.assertIn("no token of the model's vocabulary can begin it", self.text("status"))
        # A box that is not JSON is refused by the page itself.
        self.choose_format("json_schema", '{"type": ')
        self.submit("ROMEO:")
        self.wait.until(lambda b: self.text("status").startswith("schema: not JSON"))
        self.assertEqual(self.text("output"), "ROMEO:3")
        self.choose_format("text")


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, extra_args=(
        ("--model", {"required": True, "help": "the bundled model"}),
        ("--screenshot", {"required": True, "help": "where to save the page's screenshot"})))
