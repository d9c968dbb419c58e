"""The recall fixture through a real txl-server: memory answers, rewinds and forks keep exactly the
memory they should.

Examples of scripts/make_recall_corpus.py (`#c4 h1 a7|....filler....?h1?a7?c4`) go through one
session, one example after another. For each example, S at position p0:
  1. the pairs and the filler are fed (Score, commit): position p1; a fork A is made there;
  2. each query "?k" is asked with a greedy Generate of one token; the answer is the model's, then
     the session is rewound one token and fed the true value, so that a wrong answer never
     enters the history. With the pairs in memory: >= 99% of the queries are answered;
  3. A, the fork after the pairs, is asked the same queries: it answers them too, the same answers;
  4. S is rewound one turn (to p1) and asked again: the same answers as in 2;
  5. S is rewound to p0, before the pairs, and fed the pairs replaced by filler (as
     make_recall_corpus.py --cleared) and the filler: asked again, it answers near chance (1 in 10);
  6. S is rewound to p0 once more and fed the example as it is, queries and answers included.

Run by CTest: /usr/bin/python3 test_recall_rewind.py --bin-dir BUILD --stubs BUILD/client/python/gen
              --model tests/fixtures/recall.pt
"""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "..", "..", "scripts", "make_recall_corpus.py")
EXAMPLES = 150


def parse(line):
    """(stated, filler, [(key, value)]) of one example line."""
    stated, rest = line.split("|", 1)
    stated += "|"
    cut = rest.index("?")
    filler, queries = rest[:cut], rest[cut:]
    pairs = [(queries[i + 1], queries[i + 2]) for i in range(0, len(queries), 3)]
    return stated, filler, pairs


class RecallRewindTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_recall_rewind_")
        path = os.path.join(cls.tmp.name, "held_out.txt")
        subprocess.run([sys.executable, GENERATOR, "--examples", str(EXAMPLES), "--seed", "78", "--out", path],
                       check=True)
        with open(path) as f:
            cls.lines = f.read().splitlines()
        cls.server = txl_procs.Server(ARGS.bin_dir, ARGS.model)
        cls.channel = grpc.insecure_channel(cls.server.address)
        cls.stub = txl_pb2_grpc.TransformerXLStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()
        cls.tmp.cleanup()

    def feed(self, sid, text):
        return self.stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=txl_pb2.Input(text=text), commit=True),
                               timeout=60).position

    def position(self, sid):
        return self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=60).position

    def rewind(self, sid, position):
        r = self.stub.RewindSession(txl_pb2.RewindSessionRequest(session_id=sid, position=position), timeout=60)
        self.assertEqual(r.position, position)

    def ask(self, sid, pairs):
        """The session's answer to each query; afterwards it holds the true answers."""
        answers = []
        for key, value in pairs:
            req = txl_pb2.GenerateRequest(session_id=sid, input=txl_pb2.Input(text="?" + key), max_new_tokens=1,
                                          sampling=txl_pb2.SamplingParams(temperature=0))
            out = [t.text for r in self.stub.Generate(req, timeout=60) for t in r.tokens]
            self.assertEqual(len(out), 1)
            answers.append(out[0])
            self.rewind(sid, self.position(sid) - 1)  # the model's answer goes
            self.feed(sid, value)                     # the true one comes in
        return answers

    def test_memory_answers_rewinds_and_forks_keep_it(self):
        sid = self.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=60).session_id
        n = hits = fork_hits = cleared_hits = 0
        same_after_rewind = same_in_fork = True
        for line in self.lines:
            stated, filler, pairs = parse(line)
            truth = [v for _, v in pairs]
            p0 = self.position(sid)
            p1 = self.feed(sid, stated + filler)
            fork = self.stub.ForkSession(txl_pb2.ForkSessionRequest(session_id=sid), timeout=60).session_id
            answers = self.ask(sid, pairs)
            forked = self.ask(fork, pairs)
            self.stub.DeleteSession(txl_pb2.DeleteSessionRequest(session_id=fork), timeout=60)
            self.rewind(sid, p1)
            again = self.ask(sid, pairs)
            self.rewind(sid, p0)
            cleared = "." * len(stated)  # as make_recall_corpus.py --cleared
            self.feed(sid, cleared + filler)
            without = self.ask(sid, pairs)
            self.rewind(sid, p0)
            self.assertEqual(self.feed(sid, line + "\n"), p0 + len(line) + 1)

            n += len(pairs)
            hits += sum(a == t for a, t in zip(answers, truth))
            fork_hits += sum(a == t for a, t in zip(forked, truth))
            cleared_hits += sum(a == t for a, t in zip(without, truth))
            same_after_rewind &= again == answers
            same_in_fork &= forked == answers
        acc, fork_acc, cleared_acc = hits / n, fork_hits / n, cleared_hits / n
        print("recall through the server over %d queries: with the pairs %.3f, in a fork %.3f, "
              "rewound before the pairs (cleared) %.3f" % (n, acc, fork_acc, cleared_acc))
        self.assertTrue(same_in_fork, "a fork after the pairs answers as its source")
        self.assertTrue(same_after_rewind, "rewound one turn, the session answers as before")
        self.assertLessEqual(cleared_acc, 0.25, "rewound before the pairs, it can only guess")
        self.assertGreaterEqual(acc, 0.99)
        self.assertGreaterEqual(fork_acc, 0.99)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, extra_args=(
        ("--model", {"required": True, "help": "the recall fixture"}),))
