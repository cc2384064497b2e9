"""A Python job's life: the README's program runs as printed, an error on one rank stops every rank with its
reason and nothing crashes at interpreter exit, checkpoints resume exactly, and the main job learns."""
import fcntl
import json
import os
import re
import unittest
import zlib

import torch

from helpers import JOBS, ROOT, TempDirTest, alone, launch

JOB = os.path.join(JOBS, "exact_job.py")
MINIMAL = os.path.join(ROOT, "examples", "python", "minimal.py")


def first_block(path, heading, language):
    """The first ```language block after the line `heading` in a Markdown file."""
    text = open(path).read()
    at = text.index(heading + "\n")
    start = text.index("```" + language + "\n", at) + len("```" + language + "\n")
    return text[start:text.index("```\n", start)]


class Lifecycle(TempDirTest):
    def test_readme_program_is_examples_minimal_and_runs(self):
        with open(MINIMAL) as f:
            program = f.read()
        self.assertEqual(first_block(os.path.join(ROOT, "README.md"), "## Use it from Python", "python"), program,
                         "README's 'Use it from Python' block must be examples/python/minimal.py verbatim")
        self.assertEqual(first_block(os.path.join(ROOT, "docs", "python.md"), "# Poseidon for PyTorch (Python)",
                                     "python"), program)
        four = launch(4, MINIMAL, cwd=self.dir)
        self.assertEqual(four.code, 0, str(four))
        self.assertClean(four)
        for rank in range(4):  # (the launcher's prefix replaces the line's own "rank R: ")
            self.assertIn("[rank %d] step 100 loss" % rank, four.out)
        losses = [float(v) for v in re.findall(r"\[rank 0\] step \d+ loss ([0-9.]+)", four.out)]
        self.assertLess(losses[-1], losses[0], str(four))
        one = alone(MINIMAL, cwd=self.dir)
        self.assertEqual(one.code, 0, str(one))
        self.assertIn("rank 0: step 100 loss", one.out)

    def test_an_error_on_one_rank_stops_every_rank_with_its_reason(self):
        timeout = 120  # the ranks' wait limit; the bound below is derived from it, not from this machine's speed
        run = launch(4, JOB, "mlp", self.path("x.pt"), "--steps", "50", "--fail-at", "1:3", "--timeout", timeout)
        self.assertNotEqual(run.code, 0, str(run))
        self.assertClean(run)
        self.assertIn("[rank 1] RuntimeError: rank 1 fails at step 3 on purpose", run.err)
        self.assertIn("Traceback", run.err)
        # The others learn at once why (what rank 1's program raised), not after their timeout.
        self.assertRegex(run.err, r"\[rank [023]\] .*rank 1 failed .*its program raised RuntimeError: rank 1 fails at "
                                  r"step 3 on purpose")
        self.assertLess(run.seconds, timeout, str(run))

    def test_a_program_that_never_calls_finish_exits_cleanly(self):
        script = self.script(
            "nofinish.py",
            "import torch, poseidon\n"
            "m = poseidon.DistributedModel(torch.nn.Linear(4, 2), batch=3)\n"
            "m(torch.randn(3, 4)).sum().backward()\n"
            "m.synchronize()\n"
            "print('trained without finish')\n")
        run = alone(script)
        self.assertEqual(run.code, 0, str(run))
        self.assertIn("trained without finish", run.out)
        self.assertNotIn("error", run.err)  # a world of one has no peer to tell it left
        self.assertClean(run)

    def test_network_knobs_are_checked_and_taken(self):
        script = self.script(
            "knobs.py",
            "import torch, poseidon\n"
            "import datetime\n"
            "for bad in ({'io_threads': -1}, {'tcp_rcvbuf': -2}, {'send_window': 100},\n"
            "            {'urgent_layers': 2}, {'timeout': None}, {'timeout': float('inf')},\n"
            "            {'host_queue': 'pfifo_fast'}):\n"
            "    try:\n"
            "        poseidon.DistributedModel(torch.nn.Linear(4, 2), batch=3, **bad)\n"
            "    except Exception as e:\n"
            "        print('refused:', type(e).__name__, e)\n"
            "m = poseidon.DistributedModel(torch.nn.Linear(4, 2), batch=3, io_threads=1, tcp_rcvbuf=65536,\n"
            "                              timeout=datetime.timedelta(minutes=1))\n"
            "m(torch.randn(3, 4)).sum().backward()\n"
            "m.synchronize()\n"
            "print('trained with one I/O thread')\n"
            "import os\n"
            "os.environ['LOCAL_RANK'] = 'x'\n"
            "try:\n"
            "    poseidon.local_device()\n"
            "except Exception as e:\n"
            "    print('refused:', type(e).__name__, e)\n")
        run = alone(script)
        self.assertEqual(run.code, 0, str(run))
        self.assertIn("refused: InvalidArgument io_threads must be in [0, 64] (0: half the host's cores per rank "
                      "on it, 2 to 16), got -1", run.out)
        self.assertIn("refused: InvalidArgument tcp_rcvbuf must be >= -1 bytes (0: automatic, -1: the OS default), "
                      "got -2", run.out)
        self.assertIn("refused: InvalidArgument send_window must be 0 (FIFO links), -1 (the runtime's default) or "
                      "in [4096, 1073741824] bytes, got 100", run.out)
        self.assertIn("refused: InvalidArgument urgent_layers must be >= 0 (or -1: automatic) and needs send_window "
                      "(priority links), got 2", run.out)
        # timeout= as torch.distributed takes it (a timedelta) or seconds; anything else named
        self.assertIn("refused: InvalidArgument timeout is seconds (a number) or a datetime.timedelta, got None",
                      run.out)
        self.assertIn("refused: InvalidArgument timeout must be a positive finite number of seconds, got inf", run.out)
        self.assertIn("refused: InvalidArgument host_queue must be auto, fifo or tos, got 'pfifo_fast'", run.out)
        self.assertIn("trained with one I/O thread", run.out)
        # a launcher's local rank that is not a number, named (it was int()'s bare ValueError, and only
        # where a GPU was visible)
        self.assertIn("refused: InvalidArgument environment variable LOCAL_RANK='x' is not an integer >= 0", run.out)
        self.assertClean(run)

    def test_sixteen_bit_wire_rounds_each_gradient_and_the_sum_once(self):
        script = self.script(
            "wire.py",
            "import os, torch, poseidon\n"
            "try:\n"
            "    poseidon.DistributedModel(torch.nn.Linear(3, 1), batch=1, wire='fp8')\n"
            "except Exception as e:\n"
            "    print('refused:', type(e).__name__, e)\n"
            "rank = int(os.environ['RANK'])\n"
            "lin = torch.nn.Linear(3, 1, bias=False)\n"
            "m = poseidon.DistributedModel(lin, batch=1, scheme='ps', wire='bf16')\n"
            "x = torch.tensor([[0.1, 1.0 / 3, 1e-3 * (rank + 1)]])\n"
            "m(x).sum().backward()\n"  # the weight's gradient is x
            "m.synchronize()\n"
            "print('grad', ' '.join(repr(v) for v in lin.weight.grad.flatten().tolist()))\n"
            "m.finish()\n")
        run = launch(2, script)
        self.assertEqual(run.code, 0, str(run))
        self.assertIn("refused: InvalidArgument unknown wire precision 'fp8' (expected fp32, bf16 or fp16)", run.out)
        # Each rank's x rounded to bf16, summed in fp32, the sum rounded once, then halved (torch's bf16 cast
        # rounds to nearest even, as the wire does).
        bf = lambda t: t.to(torch.bfloat16).to(torch.float32)
        xs = [torch.tensor([0.1, 1.0 / 3, 1e-3 * (r + 1)]) for r in (0, 1)]
        expect = bf(bf(xs[0]) + bf(xs[1])) / 2
        self.assertNotEqual(expect.tolist(), ((xs[0] + xs[1]) / 2).tolist())  # the wire shows in the result
        for rank in (0, 1):
            self.assertIn("[rank %d] grad %s" % (rank, " ".join(repr(v) for v in expect.tolist())), run.out)
        self.assertClean(run)

    def test_overlapped_step_misuse_is_refused_and_evaluation_sees_the_update(self):
        script = self.script(
            "overlap.py",
            "import torch, poseidon\n"
            "lin = torch.nn.Linear(4, 2)\n"
            "m = poseidon.DistributedModel(lin, batch=3, overlap_forward=True)\n"
            "opt = torch.optim.SGD(m.parameters(), lr=0.5)\n"
            "x = torch.ones(3, 4)\n"
            "m(x).sum().backward()\n"
            "before = lin.weight.detach().clone()\n"
            "m.step(opt)\n"
            "print('pending, weight unchanged:', torch.equal(lin.weight, before))\n"
            "for call in (lambda: m.step(opt), m.synchronize, lambda: m.no_sync().__enter__()):\n"
            "    try:\n"
            "        call()\n"
            "    except Exception as e:\n"
            "        print('refused:', e)\n"
            "m.eval()\n"
            "with torch.no_grad():\n"
            "    m(x)\n"
            "print('evaluated, weight moved by', round((before - lin.weight).mean().item(), 4))\n"
            "m.finish()\n")
        run = alone(script)
        self.assertEqual(run.code, 0, str(run))
        self.assertIn("pending, weight unchanged: True", run.out)
        self.assertIn("refused: step() twice without a forward between them", run.out)
        self.assertIn("refused: synchronize() with overlap_forward: step(optimizer) synchronizes", run.out)
        self.assertIn("refused: no_sync() is not available with overlap_forward", run.out)
        # d(sum of outputs)/dW = 3 (rows) x 1 (input) per entry; lr 0.5: every weight moves by 1.5.
        self.assertIn("evaluated, weight moved by 1.5", run.out)
        self.assertClean(run)

    def test_an_uncaught_exception_is_what_the_job_reports(self):
        script = self.script(
            "raise.py",
            "import os, torch, poseidon\n"
            "rank = int(os.environ['RANK'])\n"
            "m = poseidon.DistributedModel(torch.nn.Linear(3, 1), batch=1)\n"
            "for step in range(3):\n"
            "    m(torch.ones(1, 3)).sum().backward()\n"
            "    if rank == 1 and step == 1:\n"
            "        raise ValueError('my bug: bad label 7')\n"
            "    m.synchronize()\n"
            "m.finish()\n")
        run = launch(2, script)
        self.assertEqual(run.code, 1, str(run))
        # Whichever rank the launcher saw fail first, its closing line names what rank 1 died of (it named
        # the runtime's "left the job before finish()", the last line after the traceback).
        closing = [line for line in run.err.splitlines() if line.startswith("poseidon launch: ")]
        self.assertEqual(len(closing), 1, str(run))
        self.assertIn("ValueError: my bug: bad label 7", closing[0])
        self.assertNotIn("left the job before finish()", run.err)
        self.assertClean(run)

    def test_a_rank_that_exits_mid_training_tells_its_peers_so(self):
        timeout = 120  # the ranks' wait limit: only rank 1's own word can end the others before it
        script = self.script(
            "exits.py",
            "import os, sys, torch, poseidon\n"
            "rank = int(os.environ['RANK'])\n"
            "m = poseidon.DistributedModel(torch.nn.Linear(3, 1), batch=1, timeout=%d)\n"
            "for step in range(50):\n"
            "    m(torch.ones(1, 3)).sum().backward()\n"
            "    m.synchronize()\n"
            "    if rank == 1 and step == 2:\n"
            "        sys.exit(0)\n"
            "m.finish()\n" % timeout)
        run = launch(3, script)
        self.assertEqual(run.code, 1, str(run))
        said = "rank 1 left the job before finish() (its program exited)"
        for rank in (0, 2):
            self.assertRegex(run.err, r"\[rank %d\] .*rank 1 failed .*" % rank + re.escape(said), str(run))
        self.assertNotIn("its program ended or threw an error", run.err)
        self.assertNotIn("lost rank", run.err)
        self.assertLess(run.seconds, timeout, str(run))
        self.assertClean(run)

    def test_a_forked_child_that_exits_leaves_the_job_alone(self):
        # A child forked mid-training holds copies of its parent's models; its exit is not the rank's.
        script = self.script(
            "forks.py",
            "import os, sys, torch, poseidon\n"
            "rank = int(os.environ['RANK'])\n"
            "m = poseidon.DistributedModel(torch.nn.Linear(3, 1), batch=1)\n"
            "for step in range(6):\n"
            "    m(torch.ones(1, 3)).sum().backward()\n"
            "    m.synchronize()\n"
            "    if rank == 1 and step == 2:\n"
            "        child = os.fork()\n"
            "        if child == 0:\n"
            "            sys.exit(0)\n"
            "        os.waitpid(child, 0)\n"
            "m.finish()\n"
            "print('finished')\n")
        run = launch(2, script)
        self.assertEqual(run.code, 0, str(run))
        self.assertEqual(run.out.count("finished"), 2, str(run))
        self.assertNotIn("left the job", run.err)
        self.assertClean(run)

    def test_ranks_that_run_different_step_counts_fail_at_once_naming_both(self):
        timeout = 120  # the ranks' wait limit: the job must end long before it
        script = self.script(
            "uneven.py",
            "import os, sys, torch, poseidon\n"
            "rank = int(os.environ['RANK'])\n"
            "steps = [int(s) for s in sys.argv[1].split(',')]\n"
            "m = poseidon.DistributedModel(torch.nn.Linear(3, 1), batch=1, timeout=%d)\n"
            "for step in range(steps[rank]):\n"
            "    m(torch.ones(1, 3)).sum().backward()\n"
            "    m.synchronize()\n"
            "m(torch.ones(1, 3))\n"  # a training forward without a step: it waits on nobody
            "m.finish()\n"
            "print('finished', steps[rank])\n" % timeout)
        for steps, short, long in (("3,5", 0, 1), ("4,2", 1, 0)):
            run = launch(2, script, steps)
            self.assertEqual(run.code, 1, str(run))
            last = min(int(s) for s in steps.split(",")) - 1
            self.assertIn("rank %d called finish() after its iteration %d, but rank %d went on to synchronize "
                          "iteration %d: every worker must run the same number of iterations" %
                          (short, last, long, last + 1), run.err)
            self.assertNotIn("timed out", run.err)
            self.assertLess(run.seconds, timeout, str(run))
            self.assertClean(run)
        even = launch(2, script, "3,3")
        self.assertEqual(even.code, 0, str(even))
        self.assertIn("[rank 1] finished 3", even.out)

    def test_first_mistakes_say_what_to_do(self):
        script = self.script(
            "mistakes.py",
            "import torch, poseidon\n"
            "lin = torch.nn.Linear(3, 1)\n"
            "opt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"
            "try:\n"  # a file where the checkpoint directory goes: not 'no checkpoint yet'
            "    poseidon.load_checkpoint(__file__, lin, opt)\n"
            "except Exception as e:\n"
            "    print('refused:', type(e).__name__, e)\n"
            "print('no checkpoint yet:', poseidon.load_checkpoint(__file__ + '.d', lin, opt))\n"
            "m = poseidon.DistributedModel(lin, batch=1)\n"
            "m.eval()\n"  # an evaluation left the model in eval mode
            "m(torch.ones(1, 3)).sum().backward()\n"
            "try:\n"
            "    m.synchronize()\n"
            "except Exception as e:\n"
            "    print('refused:', type(e).__name__, e)\n")
        run = alone(script)
        self.assertEqual(run.code, 0, str(run))
        self.assertIn("refused: InvalidArgument load_checkpoint: %s is a file, not a checkpoint directory" % script,
                      run.out)
        self.assertIn("no checkpoint yet: None", run.out)
        self.assertIn("refused: InvalidArgument synchronize()/step() after a forward() in eval mode or under no_grad "
                      "(not tracked): call train() on the model (model.train() in Python) before the training forward",
                      run.out)
        self.assertClean(run)
        # POSEIDON_LOG is the package's too: debug lines appear, a bad value fails the import by name.
        os.environ["POSEIDON_LOG"] = "debug"
        try:
            debug = alone(script)
            os.environ["POSEIDON_LOG"] = "verbose"
            bad = alone(script)
        finally:
            del os.environ["POSEIDON_LOG"]
        self.assertIn("debug:", debug.err, str(debug))
        self.assertNotEqual(bad.code, 0)
        self.assertIn("POSEIDON_LOG: unknown log level 'verbose' (expected debug, info, warning, error or off)",
                      bad.err)

    def test_two_models_in_one_program_train_in_jobs_of_their_own(self):
        script = self.script(
            "gan.py",
            "import os, torch, poseidon\n"
            "torch.manual_seed(int(os.environ['RANK']))\n"  # different data and initial weights per rank
            "g = poseidon.DistributedModel(torch.nn.Linear(4, 3), batch=2)\n"
            "d = poseidon.DistributedModel(torch.nn.Linear(3, 1), batch=2)\n"
            "og, od = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)\n"
            "for step in range(3):\n"
            "    fake = g(torch.randn(2, 4))\n"
            "    od.zero_grad(); d(fake.detach()).sum().backward(); d.step(od)\n"
            "    og.zero_grad(); fake.sum().backward(); g.step(og)\n"
            "g.finish(); d.finish()\n"
            "print('params', [round(p.sum().item(), 6) for m in (g, d) for p in m.parameters()])\n")
        run = launch(2, script)
        self.assertEqual(run.code, 0, str(run))
        said = re.findall(r"\[rank (\d)\] params (.*)", run.out)
        self.assertEqual(len(said), 2, str(run))
        self.assertEqual(said[0][1], said[1][1])  # rank 0's initial weights and the mean gradients, in both models
        self.assertClean(run)

    def test_options_are_refused_by_their_python_names(self):
        cases = {  # keyword arguments -> what DistributedModel says (world of one)
            "batch='abc'": "InvalidArgument batch must be an integer, got 'abc'",
            "batch=2.7": "InvalidArgument batch must be an integer, got 2.7",
            "batch=True": "InvalidArgument batch must be an integer, got True",
            "batch=0": "InvalidArgument batch must be at least 1, got 0",
            "batch=64.0": "accepted batch 64",
            "batch=1, urgent_layers=2.5": "InvalidArgument urgent_layers must be an integer, got 2.5",
            "batch=1, pair_bytes=3": "InvalidArgument pair_bytes must be in [4, 1073741824] bytes, got 3",
            "batch=1, sync_threads=0": "InvalidArgument sync_threads must be in [1, 1024], got 0",
            "batch=1, local_ranks=2": "InvalidArgument local_ranks=2 must divide the 1 ranks of the job",
            "batch=1, local_ranks=-1": "InvalidArgument local_ranks must be at least 0 (0: one node per host), got -1",
            "batch=1, groups='2'": "InvalidArgument groups must be an integer, got '2'",
        }
        script = self.script(
            "options.py",
            "import sys, torch, poseidon\n"
            "for kwargs in sys.argv[1:]:\n"
            "    try:\n"
            "        m = eval('poseidon.DistributedModel(torch.nn.Linear(3, 1), ' + kwargs + ')')\n"
            "        print('accepted batch', m._batch)\n"
            "    except Exception as e:\n"
            "        print(type(e).__name__, e)\n")
        run = alone(script, *cases)
        self.assertEqual(run.code, 0, str(run))
        self.assertEqual(dict(zip(cases, run.out.splitlines())), cases)
        self.assertNotIn("--", run.err)  # no C++ flag names (the rendezvous said --local-ranks)

    def test_checkpoint_resume_equals_an_uninterrupted_run(self):
        straight = launch(2, JOB, "lenet", self.path("straight.pt"), "--steps", "10")
        self.assertEqual(straight.code, 0, str(straight))
        ck = self.path("ck")
        first = launch(2, JOB, "lenet", self.path("first.pt"), "--steps", "5", "--checkpoint", ck)
        self.assertEqual(first.code, 0, str(first))
        self.assertEqual(sorted(os.listdir(ck)), [".poseidon.lock", "step-000000005"])  # rank 0's lock, and the step
        with open(os.path.join(ck, "step-000000005", "meta.json")) as f:
            meta = json.load(f)
        self.assertEqual((meta["iteration"], meta["world_size"]), (5, 2))
        resumed = launch(2, JOB, "lenet", self.path("resumed.pt"), "--steps", "10", "--checkpoint", ck)
        self.assertEqual(resumed.code, 0, str(resumed))
        a, b = torch.load(self.path("straight.pt")), torch.load(self.path("resumed.pt"))
        for p, q in zip(a["params"], b["params"]):
            self.assertTrue(torch.equal(p, q), "5 + 5 steps differ from 10 straight")

    def test_a_damaged_checkpoint_is_refused_by_name_and_the_older_one_used(self):
        ck = self.path("ck")
        run = launch(2, JOB, "mlp", self.path("a.pt"), "--steps", "10", "--checkpoint", ck, "--every", "5")
        self.assertEqual(run.code, 0, str(run))
        damaged = os.path.join(ck, "step-000000010", "model.pt")
        with open(damaged, "r+b") as f:
            f.seek(os.path.getsize(damaged) // 2)
            f.write(b"\0" * 64)
        again = launch(2, JOB, "mlp", self.path("b.pt"), "--steps", "12", "--checkpoint", ck, "--every", "5")
        self.assertEqual(again.code, 0, str(again))
        self.assertIn("checkpoint %s is damaged: model.pt does not match its checksum"
                      % os.path.join(ck, "step-000000010"), again.err)

    def test_a_checkpoint_directory_in_use_is_refused_naming_its_holder(self):
        # Two jobs given one directory would overwrite, prune and resume from each other's checkpoints. The
        # holder is this test process, by flock on the file that poseidon train's rank 0 locks too: the job's
        # writer (rank 0) is refused at its load, before it could resume from another job's model, and at its
        # saves; nothing is written. Once the holder lets go, the same job loads and saves, its model's
        # finish() frees the directory, and a save after finish() holds it only while it writes.
        ck = self.path("ck")
        os.makedirs(ck)
        script = self.script(
            "saver.py",
            "import fcntl, os, sys, torch, poseidon\n"
            "ck = sys.argv[1]\n"
            "def lock():\n"  # whether another job could take the directory now
            "    fd = os.open(os.path.join(ck, '.poseidon.lock'), os.O_RDWR)\n"
            "    try:\n"
            "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "        return 'free'\n"
            "    except BlockingIOError:\n"
            "        return 'held'\n"
            "    finally:\n"
            "        os.close(fd)\n"
            "def attempt(what, f):\n"
            "    try:\n"
            "        print(what, f())\n"
            "    except poseidon.InvalidArgument as e:\n"
            "        print(what, 'refused:', e)\n"
            "lin = torch.nn.Linear(3, 1)\n"
            "opt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"
            "attempt('load', lambda: poseidon.load_checkpoint(ck, lin, opt))\n"
            "m = poseidon.DistributedModel(lin, batch=1)\n"
            "m(torch.ones(1, 3)).sum().backward()\n"
            "m.synchronize()\n"
            "opt.step()\n"
            "attempt('save', lambda: poseidon.save_checkpoint(ck, m, opt, 1))\n"
            "m.finish()\n"
            "if m.rank == 0:\n"  # (rank 1 probing too would race rank 0's probes)
            "    print('after finish:', lock())\n"
            "    attempt('save after finish', lambda: poseidon.save_checkpoint(ck, m, opt, 2))\n"
            "    print('after that save:', lock())\n")
        fd = os.open(os.path.join(ck, ".poseidon.lock"), os.O_RDWR | os.O_CREAT)
        try:
            os.write(fd, b"job A (a test)\n")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = launch(2, script, ck)
        finally:
            os.close(fd)
        self.assertEqual(held.code, 0, str(held))
        refusal = ("refused: checkpoint directory %s is in use by job A (a test) (it holds %s): two jobs writing one "
                   "directory would resume from and delete each other's files; give each job its own directory, or "
                   "wait for that one to end" % (ck, os.path.join(ck, ".poseidon.lock")))
        for what in ("load", "save", "save after finish"):
            self.assertIn("[rank 0] %s %s" % (what, refusal), held.out)
        self.assertIn("[rank 1] load None", held.out)  # rank 1 writes nothing, so it locks nothing
        self.assertIn("[rank 0] after finish: held", held.out)
        self.assertEqual(os.listdir(ck), [".poseidon.lock"])
        free = launch(2, script, ck)
        self.assertEqual(free.code, 0, str(free))
        self.assertIn("[rank 0] load None", free.out)
        self.assertIn("[rank 0] save %s" % os.path.join(ck, "step-000000001"), free.out)
        self.assertIn("[rank 0] after finish: free", free.out)
        self.assertIn("[rank 0] save after finish %s" % os.path.join(ck, "step-000000002"), free.out)
        self.assertIn("[rank 0] after that save: free", free.out)
        with open(os.path.join(ck, ".poseidon.lock")) as f:
            self.assertRegex(f.read(), r"^poseidon checkpoints of saver\.py, pid \d+ on .+ since \d{4}-")

    def test_a_checkpoint_of_poseidon_train_is_refused_by_name(self):
        # poseidon train's format (meta.json with meta_crc32; LibTorch archives of its own models): its files
        # pass their checksums, and load_checkpoint names the format instead of failing inside torch.load.
        step = os.path.join(self.path("ck"), "step-000000005")
        os.makedirs(step)
        files = {}
        for name in ("model.pt", "optimizer.pt"):
            with open(os.path.join(step, name), "wb") as f:
                f.write(b"a LibTorch archive")
            files[name] = {"bytes": 18, "crc32": "%08x" % (zlib.crc32(b"a LibTorch archive") & 0xFFFFFFFF)}
        with open(os.path.join(step, "meta.json"), "w") as f:
            json.dump({"model": "mlp", "iteration": 5, "workers": 1, "files": files, "meta_crc32": "00000000"}, f)
        script = self.script(
            "load.py",
            "import sys, torch, poseidon\n"
            "net = torch.nn.Linear(2, 2)\n"
            "try:\n"
            "    poseidon.load_checkpoint(sys.argv[1], net, torch.optim.SGD(net.parameters(), lr=0.1))\n"
            "except poseidon.InvalidArgument as e:\n"
            "    print('refused:', e)\n")
        run = alone(script, self.path("ck"))
        self.assertEqual(run.code, 0, str(run))
        self.assertIn("refused: load_checkpoint: %s was written by poseidon train (the CLI), not by save_checkpoint; "
                      "it cannot be loaded into a Python module" % step, run.out)

    def test_a_diverged_step_raises_on_every_rank_and_the_main_job_exits_3(self):
        # One rank's NaN input at step 3: every rank's mean gradient is NaN, so every rank raises at step 3,
        # before its optimizer runs, and the job still finishes cleanly.
        script = self.script(
            "nan.py",
            "import torch, poseidon\n"
            "torch.manual_seed(0)\n"
            "net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
            "m = poseidon.DistributedModel(net, batch=3)\n"
            "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for step in range(1, 6):\n"
            "    x = torch.ones(3, 4)\n"
            "    if step == 3 and m.rank == 1:\n"
            "        x[0, 0] = float('nan')\n"
            "    opt.zero_grad()\n"
            "    m(x).sum().backward()\n"
            "    before = [p.detach().clone() for p in m.parameters()]\n"
            "    try:\n"
            "        m.step(opt)\n"
            "    except poseidon.DivergenceError as e:\n"
            "        same = all(torch.equal(a, b) for a, b in zip(before, m.parameters()))\n"
            "        print('rank %d: DivergenceError at step %d, model unchanged %s: %s' % (m.rank, step, same, e))\n"
            "        break\n"
            "m.finish()\n")
        run = launch(3, script)
        self.assertEqual(run.code, 0, str(run))
        self.assertClean(run)
        for rank in range(3):
            self.assertIn("[rank %d] DivergenceError at step 3, model unchanged True: step 3: the mean gradient of "
                          "layer '0' is not finite (a NaN or an infinity): the training diverged" % rank, run.out)

        # The main job: one line from rank 0 that says where and what to try, exit status 3, the summary says so.
        job = launch(2, os.path.join(ROOT, "examples", "python", "train_lenet.py"), "--lr", "20", "--warmup-steps", "0",
                     "--max-steps", "100", "--summary", self.path("d.json"))
        self.assertEqual(job.code, 3, str(job))
        self.assertClean(job)
        with open(self.path("d.json")) as f:
            s = json.load(f)
        self.assertTrue(s["diverged"])
        self.assertLess(s["diverged_at_step"], 100)
        self.assertEqual(s["steps"], s["diverged_at_step"])
        # One rank says it (the launcher's own last line may quote it, for whichever rank exits first).
        self.assertEqual(len(re.findall(r"\[rank \d+\] train_lenet.py: error: the training diverged", job.err)), 1,
                         str(job))
        self.assertIn("train_lenet.py: error: the training diverged at step %d (found by every rank: the mean gradient "
                      "of layer '" % s["diverged_at_step"], job.err)
        self.assertIn("at learning rate 20; try a lower --lr (e.g. 5) or a longer --warmup-steps", job.err)

    def test_main_job_learns(self):
        run = launch(4, os.path.join(ROOT, "examples", "python", "train_lenet.py"), "--max-steps", "150",
                     "--summary", self.path("s.json"))
        self.assertEqual(run.code, 0, str(run))
        self.assertClean(run)
        with open(self.path("s.json")) as f:
            s = json.load(f)
        self.assertEqual(s["workers"], 4)
        self.assertEqual({l["name"]: l["scheme"] for l in s["layers"]},
                         {"conv1": "ps", "conv2": "ps", "ip1": "sfb", "ip2": "ps"})
        print("examples/python/train_lenet.py, 4 workers, 150 steps: test accuracy %.2f%%" % (100 * s["test_accuracy"]))
        self.assertGreater(s["test_accuracy"], 0.75)


if __name__ == "__main__":
    unittest.main()
