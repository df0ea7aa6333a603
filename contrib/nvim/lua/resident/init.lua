-- resident: Neovim client of residentd. :Resident streams a reply into a
-- scratch buffer, :ResidentChat (resident.chat) holds a session, :ResidentStop
-- cancels. See :help resident.
local client = require('resident.client')

local M = {}

local defaults = {
  socket = nil, -- nil: $RESIDENT_SOCKET, $XDG_RUNTIME_DIR/resident/socket, /tmp/resident-UID/socket
  model = nil, -- nil: the daemon's default model
  max_tokens = nil, -- nil: the daemon's default (512)
  temperature = nil,
  seed = nil,
  system = nil, -- a system prompt for :Resident and new chats
  raw = false, -- :Resident sends raw text to continue, not a chat message (for base models)
  window = 'split', -- where replies and chats open: split, vsplit, tab, current
  chat_send_key = '<CR>', -- normal-mode key of chat buffers that sends the turn; false: none
}

local WINDOW_CMDS = { split = 'split', vsplit = 'vsplit', tab = 'tab split', current = nil }

M.options = vim.deepcopy(defaults)

local conn -- the connection, made on first use
local gens = {} -- generate requests in flight: id -> { buf = bufnr }
local n_replies = 0

-- Sets the options (see :help resident-setup). Can be called again.
function M.setup(opts)
  opts = opts or {}
  vim.validate({
    socket = { opts.socket, 'string', true },
    model = { opts.model, 'string', true },
    max_tokens = { opts.max_tokens, 'number', true },
    temperature = { opts.temperature, 'number', true },
    seed = { opts.seed, 'number', true },
    system = { opts.system, 'string', true },
    raw = { opts.raw, 'boolean', true },
    window = { opts.window, function(w)
      return w == nil or w == 'current' or WINDOW_CMDS[w] ~= nil
    end, 'split, vsplit, tab or current' },
    chat_send_key = { opts.chat_send_key, { 'string', 'boolean' }, true },
  })
  M.options = vim.tbl_extend('force', vim.deepcopy(defaults), opts)
  if conn ~= nil then
    conn:close()
    conn = nil
  end
end

-- The connection to the configured socket.
function M.conn()
  if conn == nil then
    conn = client.new(M.options.socket or client.default_socket(), 'nvim')
  end
  return conn
end

-- Shows an error reply (or one the connection made) to the user.
function M.error(r)
  local msg = r.message
  if r.code ~= 'connect' and r.code ~= 'closed' then
    msg = string.format('%s (%s)', r.message, r.code)
  end
  vim.notify('resident: ' .. msg, vim.log.levels.ERROR)
end

local function say(fmt, ...)
  vim.notify('resident: ' .. string.format(fmt, ...), vim.log.levels.INFO)
end

-- Opens a window for buf as options.window says.
function M.show(buf)
  local cmd = WINDOW_CMDS[M.options.window]
  if cmd ~= nil then
    vim.cmd(cmd)
  end
  vim.api.nvim_win_set_buf(0, buf)
end

-- A buffer holding text only nvim knows of (nofile), named name.
function M.scratch(name, bufhidden)
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(buf, name)
  vim.api.nvim_buf_set_option(buf, 'bufhidden', bufhidden)
  vim.api.nvim_buf_set_option(buf, 'filetype', 'markdown')
  return buf
end

-- Appends text at the end of buf; windows whose cursor was on the last line follow it.
function M.append(buf, text)
  local last = vim.api.nvim_buf_line_count(buf) - 1
  local line = vim.api.nvim_buf_get_lines(buf, last, last + 1, true)[1]
  local follow = {}
  for _, win in ipairs(vim.fn.win_findbuf(buf)) do
    if vim.api.nvim_win_get_cursor(win)[1] == last + 1 then
      table.insert(follow, win)
    end
  end
  vim.api.nvim_buf_set_text(buf, last, #line, last, #line, vim.split(text, '\n', { plain = true }))
  local n = vim.api.nvim_buf_line_count(buf)
  for _, win in ipairs(follow) do
    vim.api.nvim_win_set_cursor(win, { n, 0 })
  end
end

-- What a done reply means, for the user.
local function summary(done)
  local u, f = done.usage or {}, done.finish
  local n = u.generated_tokens or 0
  if f == 'cancel' then
    return string.format('stopped after %d tokens', n)
  elseif f == 'context' then
    return string.format("%d tokens; the model's context is full", n)
  elseif f == 'length' then
    return string.format('%d tokens; max_tokens reached', n)
  end
  return string.format('%d tokens, %.1f tokens/s', n, u.tokens_per_s or 0)
end

-- The sampling fields every generate takes from the options.
function M.sampling(fields)
  fields.max_tokens = M.options.max_tokens
  fields.temperature = M.options.temperature
  fields.seed = M.options.seed
  return fields
end

--[[
Streams a generate request's text to the end of buf. b:resident_finish is ""
while it runs, then the finish reason or "error"; b:resident_usage the usage.
on_end(reply) gets its done or error reply. Returns the request id.
]]
function M.stream(buf, fields, on_end)
  local id
  fields.op = 'generate'
  fields.stream = true
  vim.api.nvim_buf_set_var(buf, 'resident_finish', '')
  id = M.conn():request(fields, function(r)
    local valid = vim.api.nvim_buf_is_valid(buf)
    if r.type == 'token' then
      if valid then
        M.append(buf, r.text)
      elseif gens[id] ~= nil then
        M.cancel(id) -- the buffer was wiped: nobody reads on
      end
      return
    end
    gens[id] = nil
    if valid then
      vim.api.nvim_buf_set_var(buf, 'resident_finish', r.type == 'done' and r.finish or 'error')
      vim.api.nvim_buf_set_var(buf, 'resident_usage', r.usage or vim.empty_dict())
    end
    if r.type == 'error' then
      M.error(r)
    else
      say('%s', summary(r))
    end
    on_end(r, valid)
  end)
  gens[id] = { buf = buf }
  return id
end

-- Asks the daemon to cancel generate request id.
function M.cancel(id)
  gens[id] = nil
  M.conn():request({ op = 'cancel', target = id }, function(r)
    -- not_found: it ended meanwhile
    if r.type == 'error' and r.code ~= 'not_found' then
      M.error(r)
    end
  end)
end

-- :ResidentStop: cancels the generation of the current buffer, else the latest one.
function M.stop()
  local cur, pick = vim.api.nvim_get_current_buf(), nil
  for id, g in pairs(gens) do
    if g.buf == cur then
      pick = id
      break
    end
    if pick == nil or id > pick then
      pick = id
    end
  end
  if pick == nil then
    return say('nothing is being generated')
  end
  M.cancel(pick)
end

-- Byte length of the UTF-8 character starting at byte b.
local function char_len(b)
  return b >= 0xf0 and 4 or b >= 0xe0 and 3 or b >= 0xc0 and 2 or 1
end

-- The text of lines line1..line2, or of the characterwise selection when
-- the range is that of the last visual selection and it was characterwise.
local function range_text(line1, line2)
  local s, e = vim.api.nvim_buf_get_mark(0, '<'), vim.api.nvim_buf_get_mark(0, '>')
  if vim.fn.visualmode() ~= 'v' or s[1] ~= line1 or e[1] ~= line2 then
    return table.concat(vim.api.nvim_buf_get_lines(0, line1 - 1, line2, true), '\n')
  end
  local last = vim.api.nvim_buf_get_lines(0, line2 - 1, line2, true)[1]
  local ecol = #last
  if e[2] < #last then
    ecol = e[2] + char_len(last:byte(e[2] + 1))
  end
  return table.concat(vim.api.nvim_buf_get_text(0, line1 - 1, s[2], line2 - 1, ecol, {}), '\n')
end

--[[
The user message of :Resident: the prompt, then the selection (if any) fenced
with the buffer's filetype. Without a prompt the selection alone is the message.
]]
function M.message(prompt, context, filetype)
  if context == nil then
    return prompt
  elseif prompt == '' then
    return context
  end
  return string.format('%s\n\n```%s\n%s\n```', prompt, filetype, context)
end

-- :[range]Resident {prompt}: streams the reply into a new scratch buffer.
function M.reply(prompt, range, line1, line2)
  local context = range > 0 and range_text(line1, line2) or nil
  local content = M.message(prompt, context, vim.bo.filetype)
  if content == '' then
    return vim.notify("resident: usage: :Resident {prompt}, or :'<,'>Resident [prompt] on a selection",
      vim.log.levels.ERROR)
  end
  local fields = { model = M.options.model }
  if M.options.raw then
    fields.prompt = content
  else
    fields.messages = {}
    if M.options.system ~= nil then
      table.insert(fields.messages, { role = 'system', content = M.options.system })
    end
    table.insert(fields.messages, { role = 'user', content = content })
  end
  n_replies = n_replies + 1
  local buf = M.scratch('resident://reply/' .. n_replies, 'wipe')
  M.show(buf)
  M.stream(buf, M.sampling(fields), function(r, valid)
    -- a failure before any text leaves no empty window behind
    if r.type == 'error' and valid and vim.api.nvim_buf_line_count(buf) == 1
        and vim.api.nvim_buf_get_lines(buf, 0, 1, true)[1] == '' then
      vim.api.nvim_buf_delete(buf, { force = true })
    end
  end)
  return buf
end

return M
