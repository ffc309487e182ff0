import sys

from attention_doctor.cli import main

sys.exit(main())
