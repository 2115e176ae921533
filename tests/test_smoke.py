"""The engine end to end on the README's tiny triage instance."""

from api_support import TRIAGE

from service import engine
from tests.builders import compile_wire


def test_ecg_alone_separates_the_classes_and_is_chosen_first():
    inst = compile_wire(TRIAGE)
    first = engine.next_step(inst)
    assert inst.test_ids[first.next_test] == "ecg"
    # Δ_EC(ecg) cuts every edge: w = 0.1·0.6 + 0.3·0.6 = 0.24, per cost 2.
    assert abs(first.scores[first.next_test] - 0.24 / 2) < 1e-12
    after = engine.next_step(inst, engine.parse_observations(inst, [("ecg", "abnormal")]))
    assert after.done and after.stop_reason == engine.StopReason.DETERMINED
    assert inst.class_labels[int(after.belief.class_posterior.argmax())] == "admit"
