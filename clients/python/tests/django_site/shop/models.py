from django.db import models


class Order(models.Model):
    idem_key = models.TextField()
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)	# an ORM default, stored and replayed
