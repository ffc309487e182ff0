import sys

from attention.doctor.cli import main

sys.exit(main())
