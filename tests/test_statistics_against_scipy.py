"""The statistics tfopt writes by hand agree with SciPy's: Wilson intervals, McNemar's exact
test, the sign test, and the AUC's ranks."""

import numpy as np
import pytest
from scipy import stats

from tfopt.eval.metrics import BUILT_IN
from tfopt.measurement.accuracy_stats import mcnemar_p_value, wilson_interval
from tfopt.measurement.confirm import sign_test_p


@pytest.mark.parametrize(("right", "images"), [(0, 10), (3, 10), (95, 100), (329, 329),
                                               (318, 329), (1, 7)])
def test_the_wilson_interval_is_scipys(right, images):
    expected = stats.binomtest(right, images).proportion_ci(confidence_level=0.95,
                                                             method="wilson")
    assert wilson_interval(right / images, images) == pytest.approx(
        (expected.low, expected.high), abs=1e-9)


@pytest.mark.parametrize(("only_first", "only_second"), [(0, 0), (3, 0), (5, 5), (2, 9),
                                                         (14, 6), (0, 40)])
def test_mcnemars_exact_test_is_scipys_binomial_test_of_the_discordant_images(only_first,
                                                                             only_second):
    discordant = only_first + only_second
    expected = 1.0 if discordant == 0 else stats.binomtest(only_first, discordant).pvalue
    assert mcnemar_p_value(only_first, only_second) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("slower", "rounds"), [(6, 6), (5, 6), (11, 12), (6, 12), (0, 12)])
def test_the_sign_test_is_scipys_one_sided_binomial_test(slower, rounds):
    expected = stats.binomtest(slower, rounds, alternative="greater").pvalue
    assert sign_test_p(slower, rounds) == pytest.approx(expected, rel=1e-9)


def test_the_aucs_ranks_are_scipys_mann_whitney_u():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, size=300)
    scores = np.round(labels + rng.normal(size=300), 1)
    u = stats.mannwhitneyu(scores[labels == 1], scores[labels == 0]).statistic
    assert BUILT_IN["auc"].score(labels, scores) == pytest.approx(
        u / (labels.sum() * (300 - labels.sum())))
