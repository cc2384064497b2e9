"""Compute groups from Python (docs/python.md, docs/omnivore.md): real ranks under poseidon launch.
One group gives BSP's parameters bit for bit (the shards run the optimizer's SGD, the scheduler's rate
included); asynchronous groups end with every rank holding the same latest model and a staleness count
for every update the shards applied; each misuse is one clear error."""
import os
import unittest

import torch

from helpers import JOBS, TempDirTest, alone, launch

JOB = os.path.join(JOBS, "group_job.py")
STEPS = 12
LAYERS = 4  # LeNet: conv1, conv2, ip1, ip2, one 2 MB pair each


class ComputeGroups(TempDirTest):
    def params(self, name, rank):
        return torch.load("%s.rank%d" % (self.path(name), rank))

    def test_one_group_equals_bsp_bit_for_bit(self):
        bsp = launch(4, JOB, self.path("bsp"), "--steps", STEPS)
        self.assertEqual(bsp.code, 0, str(bsp))
        one = launch(4, JOB, self.path("one"), "--groups", 1, "--steps", STEPS)
        self.assertEqual(one.code, 0, str(one))
        self.assertClean(one)
        a, b = self.params("bsp", 0), self.params("one", 0)
        self.assertEqual(len(a["params"]), 8)
        for p, q, s in zip(a["params"], b["params"], b["start"]):
            self.assertTrue(torch.equal(p, q))
            self.assertFalse(torch.equal(q, s))  # trained
        # One group: every update lands on the model it was computed on.
        counts = {}
        for r in range(4):
            for s, n in self.params("one", r)["staleness"]["histogram"].items():
                counts[s] = counts.get(s, 0) + n
        self.assertEqual(counts, {0: STEPS * LAYERS})

    def test_asynchronous_groups_end_on_one_model(self):
        for groups in (2, 4):
            # Explicit momentum 0: asynchrony adds an implicit one (about 1 - 1/G), and 0.9 on top diverges.
            run = launch(4, JOB, self.path("g%d" % groups), "--groups", groups, "--steps", STEPS, "--momentum", 0)
            self.assertEqual(run.code, 0, str(run))
            self.assertClean(run)
            ranks = [self.params("g%d" % groups, r) for r in range(4)]
            for p, s in zip(ranks[0]["params"], ranks[0]["start"]):
                self.assertTrue(bool(torch.isfinite(p).all()), "%d groups" % groups)
                self.assertFalse(torch.equal(p, s))
            for r in range(1, 4):  # finish() pulled the latest model on every rank
                for p, q in zip(ranks[0]["params"], ranks[r]["params"]):
                    self.assertTrue(torch.equal(p, q), "rank %d, %d groups" % (r, groups))
            # Every group's every round reached every pair, each counted once by the shard that applied it.
            total = sum(n for r in ranks for n in r["staleness"]["histogram"].values())
            self.assertEqual(total, STEPS * groups * LAYERS, "%d groups" % groups)

    def test_misuse_is_refused_with_its_reason(self):
        run = alone(JOB, "--misuse")
        self.assertEqual(run.code, 0, str(run))
        self.assertClean(run)
        expected = {
            "two groups on one rank": "groups=2 must divide the 1 ranks of the job",
            "adam": "the shards run SGD; give optimizer=torch.optim.SGD(...) (got Adam)",
            "nesterov": "this optimizer has nesterov",
            "a partial optimizer": "the optimizer must hold exactly the module's 8 trainable parameters (it holds 2)",
            "overlap_forward": "overlap_forward is for BSP jobs",
            "optimizer without groups": "optimizer= and staleness= are for compute groups: give groups=G",
            "another optimizer at step": "step() takes the optimizer given as optimizer=",
            "save_checkpoint": "save_checkpoint: a job with compute groups keeps its momentum on the shards",
            "save_checkpoint of the module": "save_checkpoint: a job with compute groups keeps its momentum",
            "no_sync": "no_sync() is not available with compute groups",
            "a changed momentum": "the optimizer's momentum changed from 0.9 to 0.5",
        }
        lines = run.out.splitlines()
        for what, message in expected.items():
            line = next((l for l in lines if l.startswith("refused %s: " % what)), None)
            self.assertIsNotNone(line, "%s was not refused:\n%s" % (what, run))
            self.assertIn(message, line)
        self.assertIn("a round at lr 0 moved the model: False", run.out)
        self.assertIn("finished after a forward without its step", run.out)


if __name__ == "__main__":
    unittest.main()
