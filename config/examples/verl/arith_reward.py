"""The demo's reward function, written as for verl's `custom_reward_function`: the answer after
the last `####` (else the last number) against the ground truth; 0.1 for a well-formed wrong
answer, as GSM8K format rewards do. `acc` is reported per cell beside the reward."""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.1):
    marked = re.findall(r"####\s*(-?[\d,]+)", solution_str)
    numbers = marked or re.findall(r"-?\d+", solution_str)
    if not numbers:
        return {"score": 0.0, "acc": False}
    answer = numbers[-1].replace(",", "")
    correct = answer == str(ground_truth).strip()
    return {"score": 1.0 if correct else format_score if marked else 0.0, "acc": correct}
