"""`minibert.train` called from a researcher's own code."""


def test_train_and_its_config_are_at_the_top_level():
    import minibert.engine

    assert minibert.train is minibert.engine.train
    assert minibert.TrainConfig is minibert.engine.TrainConfig
    assert {"train", "TrainConfig"} <= set(minibert.__all__) and "train" in dir(minibert)
