"""Lesson 00: set-up and data (00_setup_and_data): the claim the notebook's damaged-file experiment settles.

``claims_00`` turns what the notebook measured (two damaged copies of the raw MNIST files, each loaded through
``torchvision.datasets.MNIST`` and through the series' md5 check) into the claim entries ``claims.record`` writes.
Pure: no file I/O, no printing.
"""
from __future__ import annotations


def claims_00(damaged: list[dict], full_size: int) -> list[dict]:
    """The claims of notebook 00, one dict per claim (the keyword arguments of ``claims.ResultFile.claim``).

    ``damaged``: the notebook's two rows, the changed-label copy first (keys ``loaded``, ``first_label``,
    ``original_label``, ``error``, ``md5_check``), then the truncated test-image copy; ``full_size``: the test-image
    file's size in bytes before it was cut in half.

    00.torchvision_verifies: *wrong* when torchvision loaded the changed label silently while the md5 check refused
    both copies; *holds* when torchvision refused both itself (a clear error on the changed label, no deep error on
    the cut file); *holds with nuance* in between.
    """
    flipped, cut = damaged[0], damaged[1]
    silent_wrong_label = bool(flipped["loaded"]) and flipped["first_label"] != flipped["original_label"]
    deep_error = not cut["loaded"] and "DataError" not in (cut["error"] or "")
    md5_catches = all(str(d["md5_check"]).startswith("refused") for d in damaged)
    if silent_wrong_label and md5_catches:
        verdict = "wrong"
    elif not silent_wrong_label and not deep_error:
        verdict = "holds"
    else:
        verdict = "holds with nuance"
    evidence = (f"a label file with one byte changed {'loads silently' if silent_wrong_label else 'is refused'} "
                f"(label {flipped['original_label']} read as {flipped['first_label']}); a test-image file cut to "
                f"{full_size // 2:,} of {full_size:,} bytes "
                f"{'fails inside torchvision' if deep_error else 'is refused'}; "
                f"the series' md5 check refuses {'both' if md5_catches else 'not both'}")
    return [dict(id="00.torchvision_verifies", verdict=verdict, evidence=evidence,
                 numbers={"original_label": flipped["original_label"], "label_read": flipped["first_label"],
                          "cut_bytes": full_size // 2, "full_bytes": full_size, "torchvision_error": cut["error"]},
                 regime=("torchvision.datasets.MNIST on copies of the four raw files, one changed label byte, one "
                         "truncated file"))]
