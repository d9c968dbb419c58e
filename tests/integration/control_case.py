"""ControlCase: the unittest base of the tests that compare servers with a store against a control
server (no store) on the tiny model, greedy turn by turn (test_migration.py, test_store_pauses.py).

The class shares one tiny model and one control server. Each test gets its own work directory
(self.work) and a list of cleanups (self.cleanups), run in reverse order, also when it fails.
A subclass sets `make_client` (an address -> a client with close()) and, in its setUpClass,
`bin_dir` before it calls this one's.
"""
import os
import tempfile
import unittest

import txl_procs

TOL = 1e-4  # logprobs against the control's: replays feed other chunks, so float32 rounding differs


class ControlCase(unittest.TestCase):
    bin_dir = None
    make_client = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix=f"txl_{cls.__name__}_")
        cls.model = txl_procs.tiny_model(cls.bin_dir, cls.tmp.name)
        cls.control_server = txl_procs.Server(cls.bin_dir, cls.model)
        cls.control = cls.make_client(cls.control_server.address)
        cls.runs = 0

    @classmethod
    def tearDownClass(cls):
        cls.control.close()
        cls.control_server.stop()
        cls.tmp.cleanup()

    def setUp(self):
        type(self).runs += 1
        self.work = os.path.join(self.tmp.name, f"run{self.runs}")
        os.makedirs(self.work)
        self.cleanups = []

    def tearDown(self):
        for fn in reversed(self.cleanups):
            fn()

    def assert_turns_equal(self, got, want, what):
        """got, want: ([(token id, logprob)], position) of one turn each."""
        self.assertEqual([i for i, _ in got[0]], [i for i, _ in want[0]],
                         f"{what}: token ids differ from the control's (position {got[1]} vs {want[1]})")
        for k, ((_, a), (_, b)) in enumerate(zip(got[0], want[0])):
            self.assertLess(abs(a - b), TOL, f"{what}: token {k}: logprob {a} vs the control's {b}")
        self.assertEqual(got[1], want[1], f"{what}: position differs from the control's")
