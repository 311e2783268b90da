package pool

// The waiter list: an intrusive FIFO of waiters, linked either within
// their class or across their group (byAll).

// wlist is an intrusive FIFO of waiters; byAll selects the links.
type wlist struct {
	head, tail *waiter
	n          int
}

func (q *wlist) push(w *waiter, byAll bool) {
	if byAll {
		w.aprev, w.anext = q.tail, nil
		if q.tail != nil {
			q.tail.anext = w
		} else {
			q.head = w
		}
	} else {
		w.prev, w.next = q.tail, nil
		if q.tail != nil {
			q.tail.next = w
		} else {
			q.head = w
		}
	}
	q.tail = w
	q.n++
}

func (q *wlist) remove(w *waiter, byAll bool) {
	prev, next := w.prev, w.next
	if byAll {
		prev, next = w.aprev, w.anext
	}
	if prev != nil {
		if byAll {
			prev.anext = next
		} else {
			prev.next = next
		}
	} else {
		q.head = next
	}
	if next != nil {
		if byAll {
			next.aprev = prev
		} else {
			next.prev = prev
		}
	} else {
		q.tail = prev
	}
	if byAll {
		w.aprev, w.anext = nil, nil
	} else {
		w.prev, w.next = nil, nil
	}
	q.n--
}
