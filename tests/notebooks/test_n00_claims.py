"""claims_00 (notebook 00's claim) judged from synthetic measurements: both ways, every number sourced."""
from mnist_helpers.course import claims
from mnist_helpers.lessons.n00.lesson import claims_00

FULL = 7_840_016


def rows(label_loaded=True, label_read=6, cut_error="RuntimeError: shape '[10000, 28, 28]' is invalid",
         md5=("refused: md5 mismatch", "refused: md5 mismatch")):
    return [{"loaded": label_loaded, "original_label": 5, "first_label": label_read if label_loaded else None,
             "error": "" if label_loaded else "DataError: bad labels", "md5_check": md5[0]},
            {"loaded": cut_error is None, "original_label": None, "first_label": None, "error": cut_error or "",
             "md5_check": md5[1]}]


def test_silent_wrong_label_makes_the_claim_wrong():
    [e] = claims_00(rows(), FULL)
    assert e["id"] == "00.torchvision_verifies" and e["verdict"] == "wrong"
    assert "loads silently" in e["evidence"] and "3,920,008" in e["evidence"]
    assert not claims.unsourced_numbers(e)


def test_a_torchvision_that_refuses_both_files_holds():
    [e] = claims_00(rows(label_loaded=False, cut_error="DataError: truncated"), FULL)
    assert e["verdict"] == "holds" and not claims.unsourced_numbers(e)


def test_in_between_and_a_missed_md5_check():
    # the label change read back unchanged (not silent), but the cut file fails deep inside torchvision
    [e] = claims_00(rows(label_read=5), FULL)
    assert e["verdict"] == "holds with nuance"
    # torchvision silent but the md5 check missed one copy: not "wrong" either
    [e] = claims_00(rows(md5=("refused: md5 mismatch", "passed")), FULL)
    assert e["verdict"] == "holds with nuance" and "not both" in e["evidence"]
    assert not claims.unsourced_numbers(e)


def test_record_accepts_the_entries(tmp_path):
    res = claims.record("00_setup_and_data", claims_00(rows(), FULL), profile="quick", folder=tmp_path)
    assert (tmp_path / "00_setup_and_data.json").exists()
    assert claims.summary(res)[0]["on this machine"] == claims.PLAIN["wrong"]
