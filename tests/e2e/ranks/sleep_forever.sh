#!/bin/bash
# Says it is up, then sleeps until killed.
echo "rank $RANK up"
exec sleep "1000$MARKER"
