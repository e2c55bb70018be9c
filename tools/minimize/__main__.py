import sys

from tools.minimize import main

sys.exit(main())
