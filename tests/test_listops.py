"""ListOps: the seeded generator against an independent simulation of the published sampling
process, the original tokenisation, and the TSV → cache → ids round trip."""

import collections
import hashlib
import math

import numpy as np
import pytest

from lra.data import listops
from lra.data.cache import TokenSplit
from lra.data.prepare import load_task_data
from lra.errors import UserError

OPS = ("[MIN", "[MAX", "[MED", "[SM")


def simulate(num_samples, seed, min_length=500, max_length=2000, max_depth=10, max_args=10, p_op=0.25):
    """An independent simulation of the spec's process with numpy's generator, computing value,
    length, operator counts and arities directly (no strings). Rejection as in the spec."""
    rng = np.random.default_rng(seed)

    def node(depth):
        if depth < max_depth and rng.random() < p_op:
            arity = int(rng.integers(2, max_args + 1))
            kids = [node(depth + 1) for _ in range(arity)]
            op = OPS[int(rng.integers(4))]
            values = sorted(k[0] for k in kids)
            value = {"[MIN": values[0], "[MAX": values[-1], "[SM": sum(values) % 10,
                     "[MED": int(np.median(values))}[op]
            ops = collections.Counter({op: 1})
            for k in kids:
                ops.update(k[2])
            return value, 2 + sum(k[1] for k in kids), ops, [arity] + [a for k in kids for a in k[3]]
        return int(rng.integers(10)), 1, collections.Counter(), []

    kept = []
    while len(kept) < num_samples:
        sample = node(1)
        if min_length < sample[1] < max_length:
            kept.append(sample)
    return kept


def statistics_of_generator(num_samples, seed):
    settings = listops.GeneratorSettings(seed=seed, num_train=num_samples, num_val=0, num_test=0)
    rows = list(listops.generate(settings))
    labels, lengths, ops, arities = [], [], collections.Counter(), []
    for _, source, label in rows:
        tokens = listops.tokenize(source)
        labels.append(label)
        lengths.append(len(tokens))
        ops.update(t for t in tokens if t in OPS)
        stack = []
        for t in tokens:  # arity of each operator = its direct children
            if t in OPS:
                stack.append(0)
            elif t == "X":
                arities.append(stack.pop())
                if stack:
                    stack[-1] += 1
            elif stack:
                stack[-1] += 1
    return rows, labels, lengths, ops, arities


@pytest.fixture(scope="module")
def generated():
    return statistics_of_generator(1000, seed=11)


@pytest.fixture(scope="module")
def simulated():
    return simulate(1000, seed=12)


def chi_square_two_sample(a: collections.Counter, b: collections.Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for key in set(a) | set(b):
        expected_a = (a[key] + b[key]) * na / (na + nb)
        expected_b = (a[key] + b[key]) * nb / (na + nb)
        stat += (a[key] - expected_a) ** 2 / expected_a + (b[key] - expected_b) ** 2 / expected_b
    return stat


def test_lengths_strictly_inside_the_bounds_and_no_duplicates(generated):
    rows, _, lengths, _, _ = generated
    assert all(500 < n < 2000 for n in lengths)
    assert len({source for _, source, _ in rows}) == len(rows)


def test_label_distribution_matches_the_independent_simulation(generated, simulated):
    generated_labels = collections.Counter(generated[1])
    simulated_labels = collections.Counter(s[0] for s in simulated)
    assert set(generated_labels) == set(range(10))
    # Two-sample chi-square, 9 degrees of freedom: 27.88 is the 0.1% critical value.
    assert chi_square_two_sample(generated_labels, simulated_labels) < 27.88
    # The known skew of ListOps: 0 and 9 (MIN/MAX of many digits) are the most common labels.
    assert {label for label, _ in generated_labels.most_common(2)} == {0, 9}


def test_length_operator_mix_and_arity_match_the_simulation(generated, simulated):
    _, _, lengths, ops, arities = generated
    sim_lengths = np.array([s[1] for s in simulated])
    standard_error = math.sqrt(np.var(lengths) / len(lengths) + sim_lengths.var() / len(sim_lengths))
    assert abs(np.mean(lengths) - sim_lengths.mean()) < 4 * standard_error
    sim_ops = sum((s[2] for s in simulated), collections.Counter())
    assert chi_square_two_sample(ops, sim_ops) < 16.27  # 3 dof, 0.1%
    total = sum(ops.values())
    for op in OPS:  # uniform operator choice
        assert abs(ops[op] / total - 0.25) < 4 * math.sqrt(0.25 * 0.75 / total)
    sim_arities = [a for s in simulated for a in s[3]]
    assert set(arities) <= set(range(2, 11))
    se = math.sqrt(np.var(arities) / len(arities) + np.var(sim_arities) / len(sim_arities))
    assert abs(np.mean(arities) - np.mean(sim_arities)) < 4 * se


def test_seeded_generation_is_deterministic():
    settings = listops.GeneratorSettings(seed=5, num_train=20, num_val=0, num_test=0)
    assert list(listops.generate(settings)) == list(listops.generate(settings))
    other = listops.GeneratorSettings(seed=6, num_train=20, num_val=0, num_test=0)
    assert list(listops.generate(settings)) != list(listops.generate(other))


def test_known_line_tokenises_to_its_ids():
    source = "( ( ( ( [MAX 2 ) 9 ) ( ( [SM 1 ) 0 ) ) ] )"
    assert listops.tokenize(source) == ["[MAX", "2", "9", "[SM", "1", "0", "X"]
    assert listops.encode(source).tolist() == [13, 4, 11, 15, 3, 2, 16]


def test_string_form_nests_binary_pairs():
    # [MAX 2 9 ] written as the spec's example shape, and one operator inside another
    assert listops.to_string(["[MAX", "2", "9"]) == "( ( ( [MAX 2 ) 9 ) ] )"
    tree = ["[MAX", "2", "9", ["[SM", "1", "0"]]
    assert listops.to_string(tree) == "( ( ( ( [MAX 2 ) 9 ) ( ( ( [SM 1 ) 0 ) ] ) ) ] )"
    assert listops.value_of(tree) == listops.evaluate_tokens(listops.tokenize(listops.to_string(tree))) == 9


# Digests of generated examples (split, source and label of each, in order) as the generator drew them before
# its draws were inlined: a faster generator must draw the same examples from the same seeds.
DRAWN = [(dict(seed=0, num_train=400, num_val=50, num_test=50),
          "4ac8d15b65fb0d8fe3efb23f897c23059d9b755ccd6f6b82dcd6e4092ee02da9"),
         (dict(seed=3, num_train=300, num_val=30, num_test=30, min_length=20, max_length=200, max_depth=6, max_args=5,
               operator_probability=0.4), "e2e2366dcdfa04aa9c688932a12aae2cfbd87a322c1a9bb058c063365d131464"),
         (dict(seed=1, num_train=200, num_val=20, num_test=20, min_length=10, max_length=120, max_args=2),
          "c1b4928d75e467dfa6f9d7866fce5e86fbe36bd1d218bafc06a3e1a42813faea"),
         (dict(seed=7, num_train=200, num_val=0, num_test=20, min_length=0, max_length=40, max_depth=3, max_args=16,
               operator_probability=1.0), "c6ac07a6079eb497d46983d21d35772e88f41f9616760b7ff65392dc96272bad")]


@pytest.mark.parametrize("settings, digest", DRAWN, ids=["reference", "shallow", "binary", "all-operators"])
def test_the_generator_draws_the_examples_it_always_drew(settings, digest):
    drawn = hashlib.sha256()
    for split, source, label in listops.generate(listops.GeneratorSettings(**settings)):
        assert label == listops.evaluate_tokens(listops.tokenize(source))
        drawn.update(f"{split}\t{source}\t{label}\n".encode())
    assert drawn.hexdigest() == digest


def decode(ids):
    return [listops.VOCABULARY[i] for i in ids]


def listops_task(**overrides):
    from omegaconf import OmegaConf

    from lra.config import ListOpsTaskConfig

    task = OmegaConf.structured(ListOpsTaskConfig(name="listops", source="generate", num_classes=10, vocab_size=32,
                                                  max_length=2048, batch_size=4, max_steps=1, warmup_steps=0, eval_every=1))
    task.generator.num_train, task.generator.num_val, task.generator.num_test = 40, 10, 10
    task.generator.min_length, task.generator.max_length = 30, 300
    return OmegaConf.merge(task, overrides)


def assert_round_trip(split: TokenSplit, rows):
    assert len(split) == len(rows)
    ids, masks, labels = split.gather(range(len(split)), 512)
    for row, (source, label) in enumerate(rows):
        real = ids[0][row][masks[0][row]]
        assert (ids[0][row][~masks[0][row]] == 0).all()
        assert decode(real) == listops.tokenize(source)
        assert listops.evaluate_tokens(decode(real)) == label == labels[row]


def test_generated_files_round_trip_through_the_cache(tmp_path):
    data = load_task_data(listops_task(), tmp_path, announce=lambda m: None)
    raw = next((tmp_path / "listops" / "generated").iterdir())
    for split in ("train", "val", "test"):
        assert_round_trip(data.splits[split], list(listops.read_tsv(raw / f"basic_{split}.tsv")))
    assert data.manifest["counts"] == {"train": 40, "val": 10, "test": 10}


@pytest.mark.parametrize("nesting", ["listops-1000", "lra_release/listops-1000"])
def test_release_folder_at_either_nesting_level(tmp_path, nesting):
    settings = listops.GeneratorSettings(seed=3, num_train=12, num_val=4, num_test=4, min_length=10, max_length=100)
    listops.write_tsv_files(settings, tmp_path / "release" / nesting)
    task = listops_task(source="lra_release", path=str(tmp_path / "release"))
    data = load_task_data(task, tmp_path / "data", announce=lambda m: None)
    for split in ("train", "val", "test"):
        rows = list(listops.read_tsv(tmp_path / "release" / nesting / f"basic_{split}.tsv"))
        assert_round_trip(data.splits[split], rows)


def test_missing_release_names_the_fix(tmp_path):
    with pytest.raises(UserError, match="task.path"):
        load_task_data(listops_task(source="lra_release", path=str(tmp_path)), tmp_path, announce=lambda m: None)


def test_truncated_cache_is_refused_with_the_rebuild_command(tmp_path):
    data = load_task_data(listops_task(), tmp_path, announce=lambda m: None)
    victim = data.cache_dir / "train.tokens0.npy"
    victim.write_bytes(victim.read_bytes()[:-7])
    with pytest.raises(UserError, match=r"damaged .*train.tokens0.npy.*rebuild it with: rm -r"):
        load_task_data(listops_task(), tmp_path, announce=lambda m: None)
