import os
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")   # flex_attention's eager-mode warning, once per process, is not the bed's

from doctor_lab.generated.run import main  # noqa: E402 -- after the thread count is set

sys.exit(main())
