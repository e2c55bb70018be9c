"""What is kept, and what is said from it: the findings generated from the recorded runs
(``findings``), and the comments offered upstream that quote them (``comments``)."""
