"""Compute groups from Python (docs/python.md, docs/omnivore.md): real ranks under poseidon launch.
One group gives BSP's parameters bit for bit (the shards run the optimizer's SGD, the scheduler's rate
included); asynchronous groups end with every rank holding the same latest model and a staleness count
for every update the shards applied; each misuse is one clear error."""
import json
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
        # The GPU's data path (pushes copied down to host buffers, pulls copied up), on the CPU.
        staged = launch(4, JOB, self.path("staged"), "--groups", 1, "--steps", STEPS, "--stage-on-host")
        self.assertEqual(staged.code, 0, str(staged))
        a, b, c = self.params("bsp", 0), self.params("one", 0), self.params("staged", 0)
        self.assertEqual(len(a["params"]), 8)
        for p, q, s, t in zip(a["params"], b["params"], b["start"], c["params"]):
            self.assertTrue(torch.equal(p, q))
            self.assertTrue(torch.equal(p, t))
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

    def checkpoint(self, directory, step):
        path = os.path.join(directory, "step-%09d" % step)
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        return meta, torch.load(os.path.join(path, "model.pt")), torch.load(os.path.join(path, "optimizer.pt"))

    def test_checkpoints_hold_the_shards_state_and_resume_exactly(self):
        # One group, momentum 0.9: 6 steps, a checkpoint, a new job that loads it and runs 6 more gives the
        # uninterrupted run's parameters bit for bit, which needs the shards' momentum back exactly.
        half = STEPS // 2
        straight = launch(4, JOB, self.path("straight"), "--groups", 1, "--steps", STEPS,
                          "--checkpoint", self.path("ck-straight"), "--save-at", STEPS)
        self.assertEqual(straight.code, 0, str(straight))
        ck = self.path("ck")
        first = launch(4, JOB, self.path("first"), "--groups", 1, "--steps", half, "--checkpoint", ck,
                       "--save-at", half)
        self.assertEqual(first.code, 0, str(first))
        self.assertClean(first)
        meta, model, opt = self.checkpoint(ck, half)
        self.assertEqual((meta["groups"], meta["group_version"], meta["iteration"]), (1, half, half))
        buffers = [s["momentum_buffer"] for s in opt["state"].values()]
        self.assertEqual(len(buffers), 8)
        self.assertTrue(all(bool(b.abs().sum() > 0) for b in buffers))  # the shards' momentum, not zeros
        first0 = self.params("first", 0)["params"]
        self.assertTrue(all(torch.equal(p, q) for p, q in zip(model.values(), first0)))  # the model at step 6
        resumed = launch(4, JOB, self.path("resumed"), "--groups", 1, "--steps", STEPS, "--checkpoint", ck,
                         "--resume", "--save-at", STEPS)
        self.assertEqual(resumed.code, 0, str(resumed))
        self.assertClean(resumed)
        for r in range(4):
            for p, q in zip(self.params("straight", r)["params"], self.params("resumed", r)["params"]):
                self.assertTrue(torch.equal(p, q), "rank %d" % r)
        # The version clock went on from the checkpoint's: 6 + 6 updates on every pair.
        self.assertEqual(self.checkpoint(ck, STEPS)[0]["group_version"], STEPS)
        self.assertEqual(self.checkpoint(self.path("ck-straight"), STEPS)[0]["group_version"], STEPS)

        # Two groups: no group goes on while the first worker reads the shards' state, so a checkpoint
        # taken mid-run holds exactly 3 rounds of each group (version 6), and a job resumed from it
        # without further steps ends on exactly the checkpoint's model.
        ck2 = self.path("ck2")
        two = launch(4, JOB, self.path("two"), "--groups", 2, "--steps", 6, "--momentum", 0.3, "--checkpoint", ck2,
                     "--save-at", 3)
        self.assertEqual(two.code, 0, str(two))
        meta, model, opt = self.checkpoint(ck2, 3)
        self.assertEqual((meta["groups"], meta["group_version"]), (2, 6))
        again = launch(4, JOB, self.path("again"), "--groups", 2, "--steps", 3, "--momentum", 0.3,
                       "--checkpoint", ck2, "--resume")
        self.assertEqual(again.code, 0, str(again))
        for r in range(4):
            for p, q in zip(model.values(), self.params("again", r)["params"]):
                self.assertTrue(torch.equal(p, q), "rank %d" % r)

    def test_merged_fc_one_group_trains_the_unmerged_model(self):
        # The FC server's loss is the mean of the members' mean losses and each member gets the gradient of
        # its own: one group trains the model that one group without merged FC trains, to rounding (the
        # FC layers then multiply 64 rows at once, not 16 per rank). A gradient off by the group's size k
        # or a missing update would be about 1e-3 off after 2 steps.
        merged = launch(4, JOB, self.path("merged"), "--groups", 1, "--steps", 2, "--merged-fc")
        self.assertEqual(merged.code, 0, str(merged))
        self.assertClean(merged)
        plain = launch(4, JOB, self.path("plain"), "--groups", 1, "--steps", 2)
        self.assertEqual(plain.code, 0, str(plain))
        a, b = self.params("merged", 0), self.params("plain", 0)
        self.assertEqual(a["fc_updates"], 2)  # one group, two rounds
        for p, q, s in zip(a["params"], b["params"], a["start"]):
            self.assertLess(float((p - q).abs().max()), 1e-6)
            self.assertGreater(float((p - s).abs().max()), 1e-4)  # trained
        for r in range(1, 4):  # finish() gave every rank the FC server's classifier
            other = self.params("merged", r)
            self.assertIsNone(other["fc_updates"])
            for p, q in zip(a["params"], other["params"]):
                self.assertTrue(torch.equal(p, q), "rank %d" % r)

    def test_merged_fc_groups_share_one_fc_server_and_checkpoint_it(self):
        # Two asynchronous groups, one FC server: it serves every round of each group (24 updates); only
        # the conv layers (2 pairs) go through the shards; every rank ends on one model.
        run = launch(4, JOB, self.path("g2"), "--groups", 2, "--steps", STEPS, "--momentum", 0, "--merged-fc")
        self.assertEqual(run.code, 0, str(run))
        self.assertClean(run)
        ranks = [self.params("g2", r) for r in range(4)]
        self.assertEqual(ranks[0]["fc_updates"], STEPS * 2)
        total = sum(n for r in ranks for n in r["staleness"]["histogram"].values())
        self.assertEqual(total, STEPS * 2 * 2)
        for p, s in zip(ranks[0]["params"], ranks[0]["start"]):
            self.assertTrue(bool(torch.isfinite(p).all()))
            self.assertFalse(torch.equal(p, s))
        for r in range(1, 4):
            for p, q in zip(ranks[0]["params"], ranks[r]["params"]):
                self.assertTrue(torch.equal(p, q), "rank %d" % r)

        # One group, momentum 0.9: 6 steps, a checkpoint, 6 more in a new job equal 12 straight bit for bit.
        # That needs the FC server's momentum back (ip1, ip2) as well as the shards' (conv1, conv2).
        half = STEPS // 2
        straight = launch(4, JOB, self.path("straight"), "--groups", 1, "--steps", STEPS, "--merged-fc")
        self.assertEqual(straight.code, 0, str(straight))
        ck = self.path("ck")
        first = launch(4, JOB, self.path("first"), "--groups", 1, "--steps", half, "--checkpoint", ck,
                       "--save-at", half, "--merged-fc")
        self.assertEqual(first.code, 0, str(first))
        meta, model, opt = self.checkpoint(ck, half)
        self.assertEqual((meta["groups"], meta["group_version"]), (1, half))
        buffers = [s["momentum_buffer"] for s in opt["state"].values()]
        self.assertEqual(len(buffers), 8)
        self.assertTrue(all(bool(b.abs().sum() > 0) for b in buffers))
        self.assertTrue(all(torch.equal(p, q) for p, q in zip(model.values(), self.params("first", 0)["params"])))
        resumed = launch(4, JOB, self.path("resumed"), "--groups", 1, "--steps", STEPS, "--checkpoint", ck,
                         "--resume", "--merged-fc")
        self.assertEqual(resumed.code, 0, str(resumed))
        self.assertClean(resumed)
        for r in range(4):
            for p, q in zip(self.params("straight", r)["params"], self.params("resumed", r)["params"]):
                self.assertTrue(torch.equal(p, q), "rank %d" % r)

        # Two groups checkpointed mid-run: 3 rounds of each (version 6), the FC server's classifier and
        # momentum with them; a job resumed from it without further steps ends on exactly its model.
        ck2 = self.path("ck2")
        two = launch(4, JOB, self.path("two"), "--groups", 2, "--steps", 6, "--momentum", 0.3, "--checkpoint", ck2,
                     "--save-at", 3, "--merged-fc")
        self.assertEqual(two.code, 0, str(two))
        meta, model, opt = self.checkpoint(ck2, 3)
        self.assertEqual((meta["groups"], meta["group_version"]), (2, 6))
        self.assertTrue(all(bool(s["momentum_buffer"].abs().sum() > 0) for s in opt["state"].values()))
        again = launch(4, JOB, self.path("again"), "--groups", 2, "--steps", 3, "--momentum", 0.3,
                       "--checkpoint", ck2, "--resume", "--merged-fc")
        self.assertEqual(again.code, 0, str(again))
        for r in range(4):
            for p, q in zip(model.values(), self.params("again", r)["params"]):
                self.assertTrue(torch.equal(p, q), "rank %d" % r)

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
            "load_checkpoint into a started job": "load_checkpoint: this compute-group job has started",
            "load_checkpoint into the module of a started job": "load the checkpoint into the module and the "
                                                                "optimizer before wrapping it",
            "save_checkpoint between a forward and its step": "a compute-group checkpoint between a forward and its "
                                                              "step: save it after step()",
            "save_checkpoint after finish": "a compute-group checkpoint after finish(): the shards that held the "
                                            "momentum are gone",
            "no_sync": "no_sync() is not available with compute groups",
            "a changed momentum": "the optimizer's momentum changed from 0.9 to 0.5",
            "merged_fc without groups": "merged_fc runs the other layers in compute groups: give groups=G",
            "merged_fc with a foreign classifier": "the classifier's parameters must be the module's",
            "merged_fc splitting a layer": "layer ip1 has parameters on both sides of the split",
            "merged_fc of the whole model": "every layer is in the classifier",
            "merged_fc not a pair": "merged_fc is a pair (features, classifier)",
            "fc_loss without merged FC": "fc_loss() is for merged FC",
            "fc_loss before the forward": "fc_loss() takes the features of this round's training forward, once",
            "step before fc_loss": "step() before fc_loss() and its backward",
            "fc_loss of a 4-D tensor": "the features must be a 2-D float32 tensor (rows x features), got 4-D",
            "fc_loss twice": "fc_loss() takes the features of this round's training forward, once",
        }
        lines = run.out.splitlines()
        for what, message in expected.items():
            line = next((l for l in lines if l.startswith("refused %s: " % what)), None)
            self.assertIsNotNone(line, "%s was not refused:\n%s" % (what, run))
            self.assertIn(message, line)
        self.assertIn("a round at lr 0 moved the model: False", run.out)
        self.assertIn("finished after a forward without its step", run.out)
        self.assertIn("load_checkpoint into the module after finish: None", run.out)
        self.assertIn("the FC server's updates: 1", run.out)


if __name__ == "__main__":
    unittest.main()
