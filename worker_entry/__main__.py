import os
import sys

# Before anything imports TensorFlow: Keras 3 in TF 2.21 breaks multi-worker fit and has no
# parameter-server support (keras-team/keras#20585, #18624); tf-keras works. Unless the
# spec's env or the environment tfo runs in says otherwise.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from worker_entry import lifeline  # noqa: E402

lifeline.wrap()  # the wrapper stays in there for good; the task, a child, goes on

from worker_entry.runner import main  # noqa: E402

sys.exit(main())
